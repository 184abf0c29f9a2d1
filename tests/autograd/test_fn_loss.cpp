// ag::linear_cross_entropy: f64 finite differences (through a random upstream scale, so the
// backward's device-scalar scale is exercised), equality with cross_entropy(linear(h, w)), and
// bf16 weights getting bf16 gradients.
#include "tests/autograd/gradcheck.h"

namespace loom::test {
namespace {
using V = std::vector<ag::Variable>;
using ag::Variable;

double rel_err_f64(const Tensor& a, const Tensor& b) {
  const auto x = a.to_doubles(), y = b.to_doubles();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

TEST(LinearCrossEntropy, GradCheckWithIgnoreSoftcapAndChunks) {
  auto h = random_f64({5, 4}, 31), w = random_f64({7, 4}, 32);
  Tensor targets = Tensor::from_ints({3, -100, 0, 6, 2}, {5});
  gradcheck([=](const V& v) { return ag::linear_cross_entropy(v[0], v[1], targets, 0.f, -100, 2); }, {h, w});
  gradcheck([=](const V& v) { return ag::linear_cross_entropy(v[0], v[1], targets, 1.5f, -100, 3); }, {h, w});
  gradcheck([=](const V& v) { return ag::linear_cross_entropy(v[0], v[1], targets, 0.f, -100, 2); }, {h, w},
            {true, false});  // frozen lm_head: dh only
}

// Same f64 values through both paths: only summation order differs (~1e-15).
TEST(LinearCrossEntropy, EqualsUnfusedComposition) {
  Tensor targets = Tensor::from_ints({1, 4, -100, 0, 2, 2}, {6});
  Variable h1(random_f64({6, 5}, 41), true), w1(random_f64({9, 5}, 42), true);
  Variable h2(h1.value().clone(), true), w2(w1.value().clone(), true);
  Variable fused = ag::linear_cross_entropy(h1, w1, targets, 2.f, -100, 4);
  ag::backward(ag::scale(fused, 3.f));  // backward consumes the whole tape: one path at a time
  Variable unfused = ag::cross_entropy(ag::linear(h2, w2), targets, 2.f);
  ag::backward(ag::scale(unfused, 3.f));
  EXPECT_NEAR(fused.value().to_doubles()[0], unfused.value().to_doubles()[0], 1e-12);
  EXPECT_LT(rel_err_f64(h1.grad(), h2.grad()), 1e-12);
  EXPECT_LT(rel_err_f64(w1.grad(), w2.grad()), 1e-12);
}

TEST(LinearCrossEntropy, Bf16WeightGetsBf16Gradient) {
  Tensor targets = Tensor::from_ints({1, 0, 2}, {3});
  Variable h(random_f64({3, 4}, 51).to(DType::bf16), true), w(random_f64({5, 4}, 52).to(DType::bf16), true);
  Variable loss = ag::linear_cross_entropy(h, w, targets);
  EXPECT_EQ(loss.dtype(), DType::f32);
  ag::backward(loss);
  EXPECT_EQ(h.grad().dtype(), DType::bf16);
  EXPECT_EQ(w.grad().dtype(), DType::bf16);
}

TEST(LinearCrossEntropy, MisuseThrows) {
  Tensor targets = Tensor::from_ints({1, 0}, {2});
  Variable h(random_f64({2, 4}, 1)), w(random_f64({5, 3}, 2));
  EXPECT_THROW(ag::linear_cross_entropy(h, w, targets), Error);
  Variable w32(random_f64({5, 4}, 2).to(DType::f32));
  EXPECT_THROW(ag::linear_cross_entropy(h, w32, targets), Error);
}

}  // namespace
}  // namespace loom::test
