// The consuming gated-activation backward (ops::swiglu_backward_consuming and the GeGLU one):
// the same gradients as the plain backward (which tests/kernels checks against f64 formulas),
// written into gate's and up's buffers only when nothing else holds them.
#include <gtest/gtest.h>

#include <utility>

#include "engine/ops.h"
#include "engine/tensor.h"

namespace loom::test {
namespace {

Tensor filled(int64_t n, float start, float step) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = start + step * float(i % 37) - 0.01f * float(i % 5);
  return Tensor::from_floats(v, Shape{n / 8, 8});
}

void expect_equal(const Tensor& a, const Tensor& b) {
  const auto x = a.to_floats(), y = b.to_floats();
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]) << "element " << i;
}

template <class Plain, class Consuming>
void check_consuming(Plain plain, Consuming consuming) {
  const int64_t n = 8 * 40;
  const Tensor d = filled(n, -0.7f, 0.05f);
  auto [rg, ru] = plain(filled(n, -2.f, 0.11f), filled(n, 1.5f, -0.08f), d);

  // Handed over with no other holder: the gradients land in the same buffers.
  Tensor g = filled(n, -2.f, 0.11f), u = filled(n, 1.5f, -0.08f);
  const void* gp = g.storage().get();
  const void* up = u.storage().get();
  auto [dg, du] = consuming(std::move(g), std::move(u), d);
  EXPECT_EQ(dg.storage().get(), gp);
  EXPECT_EQ(du.storage().get(), up);
  expect_equal(dg, rg);
  expect_equal(du, ru);

  // Still held by the caller: new buffers, and the caller's values are untouched.
  const Tensor g2 = filled(n, -2.f, 0.11f), u2 = filled(n, 1.5f, -0.08f);
  auto [eg, eu] = consuming(g2, u2, d);
  EXPECT_NE(eg.storage().get(), g2.storage().get());
  EXPECT_NE(eu.storage().get(), u2.storage().get());
  expect_equal(eg, rg);
  expect_equal(eu, ru);
  expect_equal(g2, filled(n, -2.f, 0.11f));
  expect_equal(u2, filled(n, 1.5f, -0.08f));

  // A transposed view is not contiguous: copied even when handed over.
  Tensor t = filled(n, -2.f, 0.11f).transpose(0, 1).contiguous().transpose(0, 1);
  const void* tp = t.storage().get();
  auto [fg, fu] = consuming(std::move(t), filled(n, 1.5f, -0.08f), d);
  EXPECT_NE(fg.storage().get(), tp);
  expect_equal(fg, rg);
  expect_equal(fu, ru);
}

TEST(OpsGlu, SwigluBackwardConsumingReusesSoleBuffers) {
  check_consuming([](const Tensor& g, const Tensor& u, const Tensor& d) { return ops::swiglu_backward(g, u, d); },
                  [](Tensor g, Tensor u, const Tensor& d) {
                    return ops::swiglu_backward_consuming(std::move(g), std::move(u), d);
                  });
}

TEST(OpsGlu, GegluBackwardConsumingReusesSoleBuffers) {
  check_consuming([](const Tensor& g, const Tensor& u, const Tensor& d) { return ops::geglu_backward(g, u, d); },
                  [](Tensor g, Tensor u, const Tensor& d) {
                    return ops::geglu_backward_consuming(std::move(g), std::move(u), d);
                  });
}

}  // namespace
}  // namespace loom::test
