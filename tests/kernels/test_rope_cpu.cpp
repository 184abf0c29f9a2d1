// CPU RoPE against a naive f64 rotation, the backward as the exact transpose (adjoint identity),
// in-place use, and the default rope_inv_freq against an independent f64 formula (the scaled
// tables: tests/models/test_rope_scaling.cpp).
#include <cmath>
#include <numbers>

#include "kernels/rope.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {


std::vector<int32_t> random_positions(int64_t tokens, uint32_t seed, int32_t max_pos) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, max_pos);
  std::vector<int32_t> p(tokens);
  for (auto& v : p) v = dist(gen);
  return p;
}

// Naive f64: the angle is the f32 product (the spec, as Hugging Face), cos/sin in f64.
// sign = +1 forward, -1 backward.
// rot: the rotated leading part of each head (transformers' q[..., :rotary_dim]; the rest is copied);
// mscale multiplies cos and sin (LongRoPE's attention scaling).
std::vector<double> naive_rope(const std::vector<double>& x, const std::vector<int32_t>& pos,
                               const std::vector<float>& inv_freq, int64_t tokens, int64_t heads, int64_t d,
                               double sign, int64_t rot = 0, double mscale = 1) {
  if (rot == 0) rot = d;
  std::vector<double> y(x.size());
  const int64_t h = rot / 2;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t hd = 0; hd < heads; ++hd)
      for (int64_t i = 0; i < d; ++i) {
        const double* xr = &x[(t * heads + hd) * d];
        if (i >= rot) {
          y[(t * heads + hd) * d + i] = xr[i];
          continue;
        }
        const int64_t j = i % h;
        const double a = double(float(pos[t]) * inv_freq[j]);
        // rotate_half(x) = cat(-x2, x1)
        const double r = i < h ? -xr[i + h] : xr[i - h];
        y[(t * heads + hd) * d + i] = mscale * (xr[i] * std::cos(a) + sign * r * std::sin(a));
      }
  return y;
}

template <class T>
class RopeCpu : public ::testing::Test {};
using Types = ::testing::Types<float, double, bf16>;
TYPED_TEST_SUITE(RopeCpu, Types);

TYPED_TEST(RopeCpu, ForwardAndBackwardMatchNaive) {
  using T = TypeParam;
  for (auto [tokens, heads, d] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 2}, {5, 3, 8}, {7, 2, 64}, {3, 4, 128}}) {
    auto x = random_vec<T>(tokens * heads * d, 41 + d), dy = random_vec<T>(tokens * heads * d, 42 + d);
    auto pos = random_positions(tokens, 43 + d, 131072);
    pos[0] = 0;  // the identity rotation is covered too
    auto inv = cpu::rope_inv_freq(d, 500000.0);
    std::vector<T> y(x.size()), dx(x.size());
    cpu::rope_forward(x.data(), y.data(), pos.data(), inv.data(), tokens, heads, d, d, 1.f);
    cpu::rope_backward(dy.data(), dx.data(), pos.data(), inv.data(), tokens, heads, d, d, 1.f);
    // f32 cos/sin of angles up to ~1.3e5 rad: libm reduces the argument exactly, so only output
    // rounding separates the kernel from the naive formula.
    EXPECT_LT(rel_error(to_f64(y), naive_rope(to_f64(x), pos, inv, tokens, heads, d, 1)), ref_tol<T>());
    EXPECT_LT(rel_error(to_f64(dx), naive_rope(to_f64(dy), pos, inv, tokens, heads, d, -1)), ref_tol<T>());
  }
}

// Phi-4-mini's partial_rotary_factor (0.75: 96 of 128 dims rotate, from a table of the rotated
// dims) and LongRoPE's attention scaling of cos and sin; both directions, in place too.
TYPED_TEST(RopeCpu, PartialRotaryAndScaledMatchNaive) {
  using T = TypeParam;
  const int64_t tokens = 5, heads = 3, d = 128, rot = 96;
  const double mscale = 1.1902380714238083;  // sqrt(1 + ln(32) / ln(4096)): Phi-3.5-mini's
  auto x = random_vec<T>(tokens * heads * d, 61), dy = random_vec<T>(tokens * heads * d, 62);
  auto pos = random_positions(tokens, 63, 131072);
  auto inv = cpu::rope_inv_freq(rot, 10000.0);
  std::vector<T> y(x.size()), dx(x.size()), z = x;
  cpu::rope_forward(x.data(), y.data(), pos.data(), inv.data(), tokens, heads, d, rot, float(mscale));
  cpu::rope_backward(dy.data(), dx.data(), pos.data(), inv.data(), tokens, heads, d, rot, float(mscale));
  const double tol = std::is_same_v<T, double> ? 1e-7 : ref_tol<T>();  // mscale is rounded to f32
  EXPECT_LT(rel_error(to_f64(y), naive_rope(to_f64(x), pos, inv, tokens, heads, d, 1, rot, mscale)), tol);
  EXPECT_LT(rel_error(to_f64(dx), naive_rope(to_f64(dy), pos, inv, tokens, heads, d, -1, rot, mscale)), tol);
  cpu::rope_forward(z.data(), z.data(), pos.data(), inv.data(), tokens, heads, d, rot, float(mscale));
  EXPECT_EQ(to_f64(z), to_f64(y));
  std::vector<T> odd(x.size());
  EXPECT_THROW(cpu::rope_forward(x.data(), odd.data(), pos.data(), inv.data(), tokens, heads, d, 95, 1.f), Error);
  EXPECT_THROW(cpu::rope_forward(x.data(), odd.data(), pos.data(), inv.data(), tokens, heads, d, 130, 1.f), Error);
}

TYPED_TEST(RopeCpu, InPlaceEqualsOutOfPlace) {
  using T = TypeParam;
  const int64_t tokens = 6, heads = 3, d = 16;
  auto x = random_vec<T>(tokens * heads * d, 51);
  auto pos = random_positions(tokens, 52, 4096);
  auto inv = cpu::rope_inv_freq(d, 10000.0);
  std::vector<T> y(x.size()), z = x;
  cpu::rope_forward(x.data(), y.data(), pos.data(), inv.data(), tokens, heads, d, d, 1.f);
  cpu::rope_forward(z.data(), z.data(), pos.data(), inv.data(), tokens, heads, d, d, 1.f);
  EXPECT_EQ(rel_error(z, y), 0.0);
  cpu::rope_backward(z.data(), z.data(), pos.data(), inv.data(), tokens, heads, d, d, 1.f);
  std::vector<T> back(x.size());
  cpu::rope_backward(y.data(), back.data(), pos.data(), inv.data(), tokens, heads, d, d, 1.f);
  EXPECT_EQ(rel_error(z, back), 0.0);
}

// The backward is the transpose: <R x, g> == <x, R^T g>, exactly up to f64 rounding.
TEST(RopeCpuF64, BackwardIsTransposeOfForward) {
  const int64_t tokens = 9, heads = 2, d = 32;
  auto x = random_vec<double>(tokens * heads * d, 61), g = random_vec<double>(tokens * heads * d, 62);
  auto pos = random_positions(tokens, 63, 100000);
  auto inv = cpu::rope_inv_freq(d, 1e6);
  std::vector<double> rx(x.size()), rtg(x.size());
  cpu::rope_forward(x.data(), rx.data(), pos.data(), inv.data(), tokens, heads, d, d, 1.f);
  cpu::rope_backward(g.data(), rtg.data(), pos.data(), inv.data(), tokens, heads, d, d, 1.f);
  double a = 0, b = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    a += rx[i] * g[i];
    b += x[i] * rtg[i];
  }
  EXPECT_NEAR(a, b, 1e-12 * x.size());
}

TEST(RopeCpuChecks, RejectsOddHeadDim) {
  std::vector<float> x(3), inv(1);
  std::vector<int32_t> pos(1);
  EXPECT_THROW(cpu::rope_forward(x.data(), x.data(), pos.data(), inv.data(), 1, 1, 3, 3, 1.f), Error);
  EXPECT_THROW(cpu::rope_inv_freq(3, 10000.0), Error);
}

// The default inv_freq against theta^(-2i/d) in f64: f32 pow and reciprocal, a few ulp.
TEST(RopeInvFreq, DefaultMatchesF64) {
  for (auto [d, theta] : {std::pair<int64_t, double>{64, 10000.0}, {128, 500000.0}, {128, 1e6}, {256, 10000.0}}) {
    auto inv = cpu::rope_inv_freq(d, theta);
    ASSERT_EQ(int64_t(inv.size()), d / 2);
    EXPECT_EQ(inv[0], 1.0f);
    for (int64_t i = 0; i < d / 2; ++i) {
      const double ref = std::pow(theta, -double(2 * i) / double(d));
      EXPECT_NEAR(inv[i], ref, 4e-7 * ref) << "d=" << d << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace loom::test
