// The grouped expert products (ag::grouped_linear, ag::grouped_linear_lora): the forward against
// per-row f64 loops, every input's gradient against f64 finite differences, experts without rows
// included, a weight kept or made a chunk of experts at a time; and the bf16 path (f32 masters used in bf16, their gradients in f32) against f64 on the
// same bf16-rounded values.
#include <gtest/gtest.h>

#include "tests/autograd/gradcheck.h"

namespace loom::test {
namespace {
using V = std::vector<ag::Variable>;
using ag::Variable;

constexpr int64_t kN = 7, kIn = 5, kOut = 4, kE = 4, kR = 2;
constexpr float kScale = 0.7f;
const std::vector<int64_t> kOffsets = {0, 2, 2, 7, 7};  // experts 1 and 3 without rows

int64_t expert_of(int64_t row) {
  int64_t e = 0;
  while (kOffsets[e + 1] <= row) ++e;
  return e;
}

// y[i] = x[i] w[e]^T + scale * (x[i] a[e]^T) b[e]^T, with e row i's expert (no adapter: a, b empty).
std::vector<double> reference(const Tensor& xs, const Tensor& ws, const Tensor& as = {}, const Tensor& bs = {}) {
  const auto x = xs.to(DType::f64).to_doubles(), w = ws.to(DType::f64).to_doubles();
  const auto a = as.defined() ? as.to(DType::f64).to_doubles() : std::vector<double>();
  const auto b = bs.defined() ? bs.to(DType::f64).to_doubles() : std::vector<double>();
  std::vector<double> y(kN * kOut, 0.0);
  for (int64_t i = 0; i < kN; ++i) {
    const int64_t e = expert_of(i);
    std::vector<double> t(kR, 0.0);
    for (int64_t q = 0; q < kR && !a.empty(); ++q)
      for (int64_t p = 0; p < kIn; ++p) t[q] += x[i * kIn + p] * a[(e * kR + q) * kIn + p];
    for (int64_t j = 0; j < kOut; ++j) {
      for (int64_t p = 0; p < kIn; ++p) y[i * kOut + j] += x[i * kIn + p] * w[(e * kOut + j) * kIn + p];
      for (int64_t q = 0; q < kR && !b.empty(); ++q) y[i * kOut + j] += kScale * t[q] * b[(e * kOut + j) * kR + q];
    }
  }
  return y;
}

std::vector<Tensor> inputs() {
  return {random_f64({kN, kIn}, 1), random_f64({kE, kOut, kIn}, 2), random_f64({kE, kR, kIn}, 3),
          random_f64({kE, kOut, kR}, 4)};
}

TEST(GroupedLinear, ForwardIsThePerRowLoop) {
  const std::vector<Tensor> in = inputs();
  ag::NoGradGuard ng;
  const auto got = ag::grouped_linear(Variable(in[0], false), Variable(in[1], false), kOffsets).value().to_doubles();
  const auto want = reference(in[0], in[1]);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-13) << i;
  const auto got_lora = ag::grouped_linear_lora(Variable(in[0], false), Variable(in[1], false),
                                                Variable(in[2], false), Variable(in[3], false), kScale, kOffsets)
                            .value()
                            .to_doubles();
  const auto want_lora = reference(in[0], in[1], in[2], in[3]);
  for (size_t i = 0; i < want_lora.size(); ++i) EXPECT_NEAR(got_lora[i], want_lora[i], 1e-13) << i;
}

TEST(GroupedLinear, GradientsMatchFiniteDifferences) {
  const std::vector<Tensor> in = inputs();
  gradcheck([](const V& v) { return ag::grouped_linear(v[0], v[1], kOffsets); }, {in[0], in[1]});
  // Each input alone, so that the other's gradient is not computed (and not needed).
  gradcheck([](const V& v) { return ag::grouped_linear(v[0], v[1], kOffsets); }, {in[0], in[1]}, {true, false});
  gradcheck([](const V& v) { return ag::grouped_linear(v[0], v[1], kOffsets); }, {in[0], in[1]}, {false, true});
}

TEST(GroupedLinearLora, GradientsMatchFiniteDifferences) {
  auto f = [](const V& v) { return ag::grouped_linear_lora(v[0], v[1], v[2], v[3], kScale, kOffsets); };
  gradcheck(f, inputs());                                // every input, w trained beside its adapter
  gradcheck(f, inputs(), {true, false, true, true});     // LoRA: w frozen
  gradcheck(f, inputs(), {false, false, true, true});    // the first layer: no input gradient
  gradcheck(f, inputs(), {true, false, false, true});    // only lora_B and x
}

// Tolerances as in test_fn_lora_bf16.cpp: y and dx are bf16 outputs (2^-9 rounding each, then
// bf16 intermediate t and dt), 1e-2 relative L2; the f32 gradients of w, A and B come from bf16
// dy, x and t, 1e-2 as well.
TEST(GroupedLinearLora, Bf16WithF32MastersMatchesF64OnTheSameValues) {
  const Tensor x = bf16_values({kN, kIn}, 5, 1.0), w = bf16_values({kE, kOut, kIn}, 6, 0.5);
  const Tensor a = bf16_values({kE, kR, kIn}, 7, 0.5), b = bf16_values({kE, kOut, kR}, 8, 0.5);
  const Tensor dy = bf16_values({kN, kOut}, 9, 1.0);
  struct Got {
    Tensor y, dx, dw, da, db;
  };
  auto run = [&](DType dt, bool lora) {
    const DType master = dt == DType::f64 ? DType::f64 : DType::f32;
    Variable xv(x.to(dt), true), wv(w.to(master), true), av(a.to(master), true), bv(b.to(master), true);
    Variable y = lora ? ag::grouped_linear_lora(xv, wv, av, bv, kScale, kOffsets) : ag::grouped_linear(xv, wv, kOffsets);
    const Tensor yv = y.value();
    ag::backward(y, dy.to(dt));
    return Got{yv, xv.grad(), wv.grad(), lora ? av.grad() : Tensor(), lora ? bv.grad() : Tensor()};
  };
  for (bool lora : {false, true}) {
    const Got ref = run(DType::f64, lora), got = run(DType::bf16, lora);
    EXPECT_EQ(got.y.dtype(), DType::bf16);
    EXPECT_EQ(got.dx.dtype(), DType::bf16);
    EXPECT_EQ(got.dw.dtype(), DType::f32) << "an f32 master's gradient comes back in f32";
    EXPECT_LT(rel_err(got.y, ref.y), 1e-2) << "lora " << lora;
    EXPECT_LT(rel_err(got.dx, ref.dx), 1e-2) << "lora " << lora;
    EXPECT_LT(rel_err(got.dw, ref.dw), 1e-2) << "lora " << lora;
    if (!lora) continue;
    EXPECT_EQ(got.da.dtype(), DType::f32);
    EXPECT_EQ(got.db.dtype(), DType::f32);
    EXPECT_LT(rel_err(got.da, ref.da), 1e-2);
    EXPECT_LT(rel_err(got.db, ref.db), 1e-2);
  }
}

// A frozen weight made on demand (ExpertWeightFn: QLoRA's dequantised experts), `chunk` experts at a
// time: the same per-row loop forward, the input's and the adapter's gradients by finite differences,
// and only the chunks with rows made (experts 1 and 3 have none).
ag::ExpertWeightFn made_from(const Tensor& w, int64_t chunk, std::vector<int64_t>* made = nullptr) {
  return {w.shape(), chunk,
          [w, made](int64_t first, int64_t count, DType dtype) {
            if (made) made->push_back(first);
            return w.narrow(0, first, count).to(dtype).contiguous();
          }};
}

TEST(GroupedLinear, AWeightMadeAChunkAtATimeIsTheWholeProduct) {
  const std::vector<Tensor> in = inputs();
  for (int64_t chunk : {1, 2, 3, 0}) {
    std::vector<int64_t> made;
    {
      ag::NoGradGuard ng;
      const auto got = ag::grouped_linear(Variable(in[0], false), made_from(in[1], chunk, &made), kOffsets)
                           .value()
                           .to_doubles();
      const auto want = reference(in[0], in[1]);
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-13) << chunk << " " << i;
      const auto got_lora = ag::grouped_linear_lora(Variable(in[0], false), made_from(in[1], chunk), Variable(in[2], false),
                                                    Variable(in[3], false), kScale, kOffsets)
                                .value()
                                .to_doubles();
      const auto want_lora = reference(in[0], in[1], in[2], in[3]);
      for (size_t i = 0; i < want_lora.size(); ++i) EXPECT_NEAR(got_lora[i], want_lora[i], 1e-13) << chunk << " " << i;
    }
    // Experts 0 and 2 have rows: chunks of 1 make those two, chunks of 2 and 3 make both of theirs
    // ({0, 1} and {2, 3}; {0, 1, 2} and {3} has none), and 0 makes all four at once.
    const std::vector<int64_t> want_made = chunk == 1 || chunk == 2 ? std::vector<int64_t>{0, 2} : std::vector<int64_t>{0};
    EXPECT_EQ(made, want_made) << "chunk " << chunk;
    // The input gradient makes them again, last chunk first (a maker may still hold it).
    made.clear();
    Variable x(in[0], true);
    ag::backward(ag::sum(ag::grouped_linear(x, made_from(in[1], chunk, &made), kOffsets)));
    std::vector<int64_t> want_again = want_made;
    want_again.insert(want_again.end(), want_made.rbegin(), want_made.rend());
    EXPECT_EQ(made, want_again) << "chunk " << chunk;
    gradcheck([&](const V& v) { return ag::grouped_linear(v[0], made_from(in[1], chunk), kOffsets); }, {in[0]});
    auto lora = [&](const V& v) {
      return ag::grouped_linear_lora(v[0], made_from(in[1], chunk), v[1], v[2], kScale, kOffsets);
    };
    gradcheck(lora, {in[0], in[2], in[3]});
    gradcheck(lora, {in[0], in[2], in[3]}, {false, true, true});  // the first layer: no input gradient
  }
}

TEST(GroupedLinear, MisfitsAreErrors) {
  const std::vector<Tensor> in = inputs();
  ag::NoGradGuard ng;
  const Variable x(in[0], false), w(in[1], false), a(in[2], false), b(in[3], false);
  EXPECT_THROW(ag::grouped_linear(x, w, {0, 2, 7}), Error);                // E + 1 offsets
  EXPECT_THROW(ag::grouped_linear(x, w, {0, 2, 2, 6, 6}), Error);          // not ending at N
  EXPECT_THROW(ag::grouped_linear(Variable(in[0].to(DType::f32), false), w, kOffsets), Error);  // f64 w, f32 x
  EXPECT_THROW(ag::grouped_linear_lora(x, w, b, a, kScale, kOffsets), Error);                    // A and B swapped
}

}  // namespace
}  // namespace loom::test
