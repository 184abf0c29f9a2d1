// The mixture-of-experts ops on CUDA (kernels/cuda/moe.cu) against the CPU reference on the same
// inputs: routing (ids identical, ties included), its backward, the dispatch (identical), the
// combine (the CPU's bits forward, dys too) and the load-balancing loss, at Qwen3-30B-A3B's
// (E 128, K 8) and Mixtral's (E 8, K 2) shapes and at edges (one expert, 1000 experts, k 32, a
// partial last warp or chunk, hidden sizes off the vector width).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "engine/ops.h"

namespace loom::test {
namespace {

#define LOOM_REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

const Device kGpu = Device::cuda(0);

struct Shape3 {
  int64_t tokens, experts, k;
};
// Qwen3-30B-A3B, Mixtral, a partial block of warps, E not a multiple of 32, the largest E and k,
// one expert.
const Shape3 kShapes[] = {{4096, 128, 8}, {333, 8, 2}, {77, 256, 16}, {50, 60, 5}, {9, 1000, 32}, {5, 1, 1}};

std::vector<float> uniform(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// Logits in [-4, 4] on a grid of `step`: equal logits (ties) are common, and unequal ones differ by
// a factor exp(step) or more in probability, far beyond the few ulps the two backends' expf and
// sums differ by, so the CPU's order is the only right one. Row 0 is all equal (the choice is
// experts 0..k-1); row 1 holds the largest value at two experts, the next one at three.
Tensor grid_logits(int64_t tokens, int64_t experts, float step, uint32_t seed) {
  std::vector<float> v = uniform(tokens * experts, seed, -4.f, 4.f);
  for (float& x : v) x = std::round(x / step) * step;
  if (tokens > 0) std::fill(v.begin(), v.begin() + experts, 0.5f);
  if (tokens > 1 && experts >= 6) {
    float* r = v.data() + experts;
    for (int64_t e = 0; e < experts; ++e) r[e] = std::min(r[e], 4.f);
    r[experts - 1] = r[experts / 2] = 5.f;
    r[0] = r[experts - 2] = r[experts / 3] = 4.5f;
  }
  return Tensor::from_floats(v, {tokens, experts});
}

// |got - want| <= tol elementwise, reporting the first few misses.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < want.size() && misses < 5; ++i)
    if (!(std::abs(double(got[i]) - want[i]) <= tol)) {
      ADD_FAILURE() << what << " [" << i << "]: " << got[i] << " vs " << want[i] << " (tolerance " << tol << ")";
      ++misses;
    }
}

std::string label(const Shape3& s, bool renorm) {
  return "T " + std::to_string(s.tokens) + " E " + std::to_string(s.experts) + " K " + std::to_string(s.k) +
         (renorm ? " renorm" : "");
}

TEST(OpsMoeCuda, RouteIsTheCpuRoute) {
  LOOM_REQUIRE_CUDA();
  for (const Shape3& s : kShapes)
    for (float step : {0.25f, 1.f / 256})
      for (bool renorm : {true, false}) {
        const Tensor logits = grid_logits(s.tokens, s.experts, step, uint32_t(s.experts * 7 + s.k));
        const ops::MoeRoute want = ops::moe_route(logits, s.k, renorm), got = ops::moe_route(logits.to(kGpu), s.k, renorm);
        ASSERT_TRUE(got.ids.is_cuda() && got.weights.is_cuda());
        const std::string what = label(s, renorm) + " step " + std::to_string(step);
        EXPECT_EQ(got.ids.to_ints(), want.ids.to_ints()) << what;
        // Weights are probabilities (<= 1): expf within 2 ulps and the softmax's sum in another
        // order leave each within a few ulps of 1, 1e-6 covers them.
        expect_close(got.weights.to_floats(), want.weights.to_floats(), 1e-6, what + " weights");
        // Independently of the CPU: the all-equal row 0 chooses experts 0..k-1.
        const std::vector<int32_t> ids = got.ids.to_ints();
        for (int64_t j = 0; j < s.k; ++j) EXPECT_EQ(ids[j], j) << what;
      }
}

TEST(OpsMoeCuda, RouteBackwardIsTheCpuBackward) {
  LOOM_REQUIRE_CUDA();
  for (const Shape3& s : kShapes)
    for (bool renorm : {true, false}) {
      const Tensor logits = grid_logits(s.tokens, s.experts, 1.f / 256, uint32_t(s.tokens + s.k));
      const ops::MoeRoute route = ops::moe_route(logits, s.k, renorm);  // the same choices on both
      const Tensor dw = Tensor::from_floats(uniform(s.tokens * s.k, 11, -1.f, 1.f), {s.tokens, s.k});
      const Tensor want = ops::moe_route_backward(logits, route, dw, renorm);
      const Tensor got =
          ops::moe_route_backward(logits.to(kGpu), {route.ids.to(kGpu), route.weights.to(kGpu)}, dw.to(kGpu), renorm);
      ASSERT_TRUE(got.is_cuda());
      // Sums of a few products of numbers <= 1 in magnitude, p from expf: a few ulps of 1.
      expect_close(got.to_floats(), want.to_floats(), 2e-6, label(s, renorm) + " dlogits");
    }
}

void expect_same_dispatch(const Tensor& ids, int64_t experts, const std::string& what) {
  const ops::MoeDispatch want = ops::moe_dispatch(ids, experts), got = ops::moe_dispatch(ids.to(kGpu), experts);
  ASSERT_TRUE(got.token_of_row.is_cuda() && got.row_of.is_cuda() && got.device_offsets.is_cuda()) << what;
  EXPECT_EQ(got.offsets, want.offsets) << what;
  const Tensor dev = got.device_offsets.to(Device::cpu());
  EXPECT_EQ(std::vector<int64_t>(dev.data<int64_t>(), dev.data<int64_t>() + experts + 1), want.offsets) << what;
  EXPECT_EQ(got.token_of_row.to_ints(), want.token_of_row.to_ints()) << what;
  EXPECT_EQ(got.row_of.to_ints(), want.row_of.to_ints()) << what;
}

TEST(OpsMoeCuda, DispatchIsTheCpuDispatch) {
  LOOM_REQUIRE_CUDA();
  for (const Shape3& s : kShapes) {  // the router's choices: k distinct experts per token
    const Tensor logits = grid_logits(s.tokens, s.experts, 1.f / 256, uint32_t(s.experts + s.k));
    expect_same_dispatch(ops::moe_route(logits, s.k, true).ids, s.experts, label(s, false));
  }
  // Skewed choices with repeats inside a token and inside each warp's 32: most go to expert 3,
  // some experts get none; 15000 assignments end in a partial chunk of 1024.
  for (const Shape3& s : {Shape3{5000, 37, 3}, Shape3{4096, 128, 8}, Shape3{1, 4, 3}, Shape3{700, 1024, 32}}) {
    std::mt19937 g(uint32_t(s.tokens));
    std::uniform_int_distribution<int32_t> any(0, int32_t(s.experts - 1));
    std::bernoulli_distribution popular(0.7);
    std::vector<int32_t> v(s.tokens * s.k);
    for (int32_t& x : v) x = popular(g) ? std::min<int32_t>(3, int32_t(s.experts - 1)) : any(g) / 2;
    expect_same_dispatch(Tensor::from_ints(v, {s.tokens, s.k}), s.experts, label(s, false) + " skewed");
  }
  // An expert outside [0, E) is an error on CUDA too, named after the op.
  EXPECT_THROW(ops::moe_dispatch(Tensor::from_ints({2, 0, 1, 5}, {2, 2}).to(kGpu), 5), Error);
  EXPECT_THROW(ops::moe_dispatch(Tensor::from_ints({2, 0, -1, 4}, {2, 2}).to(kGpu), 5), Error);
  // No tokens: empty rows, zero offsets.
  const ops::MoeDispatch none = ops::moe_dispatch(Tensor::empty({0, 2}, DType::i32, kGpu), 4);
  EXPECT_EQ(none.offsets, std::vector<int64_t>(5, 0));
}

// Routing of random logits, its dispatch and the expert outputs ys [T K, H] of the given dtype.
struct CombineCase {
  Tensor ys, row_of, weights, dy;
};
CombineCase combine_case(int64_t tokens, int64_t experts, int64_t k, int64_t h, DType dt) {
  const Tensor logits = grid_logits(tokens, experts, 1.f / 256, uint32_t(h));
  const ops::MoeRoute r = ops::moe_route(logits, k, false);
  return {Tensor::from_floats(uniform(tokens * k * h, 1, -2.f, 2.f), {tokens * k, h}).to(dt),
          ops::moe_dispatch(r.ids, experts).row_of, r.weights,
          Tensor::from_floats(uniform(tokens * h, 2, -1.f, 1.f), {tokens, h}).to(dt)};
}

TEST(OpsMoeCuda, CombineIsTheCpuCombine) {
  LOOM_REQUIRE_CUDA();
  struct Case {
    int64_t tokens, experts, k, h;
  };
  // Hidden 512 takes 16-byte accesses; 131 and 65 the scalar path.
  for (const Case& c : {Case{4096, 128, 8, 512}, Case{333, 8, 2, 131}, Case{77, 256, 16, 65}, Case{3, 40, 32, 8}})
    for (DType dt : {DType::f32, DType::bf16}) {
      const std::string what = "T " + std::to_string(c.tokens) + " K " + std::to_string(c.k) + " H " +
                               std::to_string(c.h) + " " + std::string(name(dt));
      const CombineCase in = combine_case(c.tokens, c.experts, c.k, c.h, dt);
      const Tensor ys = in.ys.to(kGpu), row_of = in.row_of.to(kGpu), w = in.weights.to(kGpu), dy = in.dy.to(kGpu);
      // Forward and dys: every product and sum rounded as the CPU rounds it, so the same bits.
      const Tensor y = ops::moe_combine(ys, row_of, w);
      ASSERT_TRUE(y.is_cuda()) << what;
      EXPECT_EQ(y.to_floats(), ops::moe_combine(in.ys, in.row_of, in.weights).to_floats()) << what;
      const auto [dys, dw] = ops::moe_combine_backward(ys, row_of, w, dy);
      const auto [dys_cpu, dw_cpu] = ops::moe_combine_backward(in.ys, in.row_of, in.weights, in.dy);
      EXPECT_EQ(dys.to_floats(), dys_cpu.to_floats()) << what;
      // dw: a dot of H products in f32, summed in another order than the CPU's; against f64 the
      // error is bounded by about (H / 128 + log2 128) ulps of sum |ys dy|: 1e-5 of it is ample,
      // and far below a missing or misplaced term.
      const std::vector<float> ys_v = in.ys.to_floats(), dy_v = in.dy.to_floats(), got = dw.to_floats(),
                               cpu = dw_cpu.to_floats();
      const std::vector<int32_t> rows = in.row_of.to_ints();
      for (int64_t a = 0; a < c.tokens * c.k; ++a) {
        double exact = 0, mag = 0;
        for (int64_t x = 0; x < c.h; ++x) {
          const double p = double(ys_v[rows[a] * c.h + x]) * dy_v[(a / c.k) * c.h + x];
          exact += p;
          mag += std::abs(p);
        }
        ASSERT_NEAR(got[a], exact, 1e-5 * mag + 1e-30) << what << " dw " << a;
        ASSERT_NEAR(cpu[a], exact, 1e-5 * mag + 1e-30) << what << " dw (CPU) " << a;
      }
    }
}

TEST(OpsMoeCuda, AuxLossIsTheCpuLoss) {
  LOOM_REQUIRE_CUDA();
  // 4096 tokens: 64 blocks of 64 in the probability sums; 300: a partial block; 70001: blocks of
  // 72 (at most 1024 blocks), the last one partial.
  for (const Shape3& s :
       {Shape3{4096, 128, 8}, Shape3{333, 8, 2}, Shape3{300, 1000, 4}, Shape3{70001, 8, 2}, Shape3{5, 1, 1}}) {
    const std::string what = label(s, false);
    const Tensor logits = grid_logits(s.tokens, s.experts, 1.f / 256, uint32_t(s.tokens));
    const Tensor ids = ops::moe_route(logits, s.k, false).ids, l64 = logits.to(DType::f64);
    const Tensor loss = ops::moe_aux_loss(logits.to(kGpu), ids.to(kGpu));
    ASSERT_TRUE(loss.is_cuda() && loss.dtype() == DType::f32 && loss.numel() == 1) << what;
    // f32 sums of N probabilities per expert (per block, then over blocks): within 1e-5 relative
    // of the f64 loss of the same logits (a wrong count or probability moves it by > 1e-3).
    const double want = ops::moe_aux_loss(l64, ids).to_doubles()[0];
    EXPECT_NEAR(loss.item(), want, 1e-5 * want) << what;

    const Tensor dloss = Tensor::from_floats({0.37f}, {});
    const Tensor got = ops::moe_aux_loss_backward(logits.to(kGpu), ids.to(kGpu), dloss.to(kGpu));
    ASSERT_TRUE(got.is_cuda()) << what;
    const std::vector<double> ref = ops::moe_aux_loss_backward(l64, ids, dloss.to(DType::f64)).to_doubles();
    double scale = 0;
    for (double x : ref) scale = std::max(scale, std::abs(x));
    // Each entry is p (g - <g, p>) with g_e = dloss E c_e / N^2. With balanced counts g - <g, p> nearly
    // cancels, so f32 loses digits relative to the terms, not to the result (and <g, p> sums E of them):
    // 32 f32 ulps of p max(g) per entry (measured on the H200 at N = 70001, E = 8: 1.8e-12, where 16
    // ulps of p max(g) are about 2.4e-12), beside 1e-5 of the largest entry.
    std::vector<double> count(s.experts, 0.0);
    for (int32_t e : ids.to_ints()) count[e] += 1;
    const double gmax = 0.37 * s.experts * *std::max_element(count.begin(), count.end()) /
                        (static_cast<double>(s.tokens) * static_cast<double>(s.tokens));
    const std::vector<double> lg = l64.to_doubles();
    const std::vector<float> g = got.to_floats();
    for (int64_t t = 0; t < s.tokens; ++t) {
      double mx = -INFINITY, z = 0;
      for (int64_t e = 0; e < s.experts; ++e) mx = std::max(mx, lg[t * s.experts + e]);
      for (int64_t e = 0; e < s.experts; ++e) z += std::exp(lg[t * s.experts + e] - mx);
      for (int64_t e = 0; e < s.experts; ++e) {
        const size_t i = static_cast<size_t>(t * s.experts + e);
        const double p = std::exp(lg[i] - mx) / z;
        ASSERT_NEAR(g[i], ref[i], 1e-5 * scale + 32 * 1.2e-7 * p * gmax) << what << " dlogits " << i;
      }
    }
  }
}

}  // namespace
}  // namespace loom::test
