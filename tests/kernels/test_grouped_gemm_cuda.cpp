// The kSm90 grouped GEMM kernel (kernels/cuda/grouped_gemm_sm90.cu) at both tile widths (kSm90,
// kSm90Wide), with the cuBLASLt loop as a
// control of the harness, against an f64 CPU reference on the same bf16 values: row-grouped
// (forward with trans_b, input gradient without) and reduction-grouped (weight gradient) problem
// lists, bf16 and f32 outputs, beta 0 (into NaNs) and 1, experts without rows, with fewer rows than
// a tile and row counts off the tile; K and M off the tile; 1, 8 and 128 experts; a Qwen3-like shape;
// dual lists (a second product of its own depth, a LoRA term, summed into the same output). The
// row-grouped cases run the TMA-fed kernel (kernels/grouped_gemm_tma.h) too, alone and in clusters of two.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_tma.h"
#include "tests/kernels/cublaslt_test.h"

namespace loom::test {
namespace {

enum class Kind { kForward, kInputGrad, kWeightGrad };
const char* kind_name(Kind k) {
  return k == Kind::kForward ? "fwd" : k == Kind::kInputGrad ? "dgrad" : "wgrad";
}

struct Case {
  Kind kind;
  std::vector<int64_t> offsets;  // E + 1 row offsets
  int64_t k, m;                  // row-grouped: A [N, k], B [E, m, k] or [E, k, m]; wgrad: A [N, m], B [N, k]
  GemmType c_type;
  float alpha, beta;
  int64_t k2 = 0;  // row-grouped: a second product A2 [N, k2] op(B2[e]) summed into C (a dual list)
};

std::string describe(const Case& c) {
  return std::string(kind_name(c.kind)) + " E=" + std::to_string(c.offsets.size() - 1) +
         " N=" + std::to_string(c.offsets.back()) + " k=" + std::to_string(c.k) + " m=" + std::to_string(c.m) +
         " C=" + gemm_type_name(c.c_type) + " alpha=" + std::to_string(c.alpha) + " beta=" + std::to_string(c.beta) +
         (c.k2 > 0 ? " k2=" + std::to_string(c.k2) : "");
}

// The second products of a dual case: its own depth k2 over A2, B2, into the same C.
std::vector<GemmArgs> second_of(const Case& c, const void* a2, const void* b2, void* out, GemmType ab, GemmType ct);

// A row-grouped case's products over operands at a, b, c of the given types.
RowGroupedGemm row_gemm_of(const Case& c, const void* a, const void* b, void* out, GemmType ab, GemmType ct) {
  RowGroupedGemm g;
  g.a = a, g.lda = c.k, g.b = b, g.c = out;
  g.k = c.k, g.m = c.m, g.trans_b = c.kind == Kind::kForward;
  g.ab_type = ab, g.c_type = ct, g.alpha = c.alpha, g.beta = c.beta;
  return g;
}

// The problem list of a case over operands at a, b, c of the given types.
std::vector<GemmArgs> problems_of(const Case& c, const void* a, const void* b, void* out, GemmType ab, GemmType ct) {
  if (c.kind == Kind::kWeightGrad) {
    ReductionGroupedGemm g;
    g.a = a, g.lda = c.m, g.b = b, g.ldb = c.k, g.c = out;
    g.m = c.m, g.k = c.k, g.ab_type = ab, g.c_type = ct, g.alpha = c.alpha, g.beta = c.beta;
    return reduction_grouped_problems(g, c.offsets);
  }
  return row_grouped_problems(row_gemm_of(c, a, b, out, ab, ct), c.offsets);
}

std::vector<GemmArgs> second_of(const Case& c, const void* a2, const void* b2, void* out, GemmType ab, GemmType ct) {
  Case d = c;
  d.k = c.k2;
  return problems_of(d, a2, b2, out, ab, ct);
}

std::vector<double> widen(const std::vector<bf16>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = double(bf16_to_float(v[i]));
  return out;
}
std::vector<double> absolute(std::vector<double> v) {
  for (double& x : v) x = std::abs(x);
  return v;
}

template <class TC>
std::vector<TC> initial_c(size_t n, bool poison, uint32_t seed) {
  if (poison) return std::vector<TC>(n, from_acc<TC>(NAN));
  return random_vec<TC>(n, seed);
}

// A case's operands and its f64 reference, made once and checked against every kernel (the reference
// of the Qwen3-sized dual case costs tens of seconds on one core: once, not once a kernel).
template <class TC>
struct Reference {
  std::vector<bf16> a, b, a2, b2;
  std::vector<TC> c0;               // C's initial values and the canary past its end
  std::vector<double> want, bound;  // the products over C0; |A||B| + |beta C0|
  // What the loop (cuBLASLt, one call a product) rounds to a bf16 C before its last rounding: alpha A B
  // when it accumulates (it rounds the product, then the sum), and with a dual list the first call's C,
  // alpha A2 B2 and, if beta != 0, the first call's product as well. Each rounding is at most 2^-8 of
  // the value rounded, which can be far larger than the result when the terms cancel. Empty when it
  // does not apply (an f32 C, or neither beta nor a second list).
  std::vector<double> loop_rounded;
  std::vector<char> covered;  // which elements of C some problem writes
};

constexpr size_t kCanary = 256;

template <class TC>
Reference<TC> reference_of(const Case& c) {
  Reference<TC> r;
  const int64_t experts = static_cast<int64_t>(c.offsets.size()) - 1, n = c.offsets.back();
  const bool wgrad = c.kind == Kind::kWeightGrad, dual = c.k2 > 0;
  const size_t a_size = size_t(n * (wgrad ? c.m : c.k));
  const size_t b_size = size_t(wgrad ? n * c.k : experts * c.k * c.m);
  const size_t c_size = size_t(wgrad ? experts * c.m * c.k : n * c.m);
  r.a = random_vec<bf16>(a_size, 11), r.b = random_vec<bf16>(b_size, 12);
  r.c0 = initial_c<TC>(c_size + kCanary, c.beta == 0.f, 13);
  r.a2 = random_vec<bf16>(dual ? size_t(n * c.k2) : 0, 14);
  r.b2 = random_vec<bf16>(dual ? size_t(experts * c.k2 * c.m) : 0, 15);

  r.want.resize(c_size), r.bound.assign(c_size, 0.0);
  for (size_t i = 0; i < c_size; ++i) r.want[i] = double(to_acc(r.c0[i]));
  const std::vector<double> a64 = widen(r.a), b64 = widen(r.b), a_abs = absolute(a64), b_abs = absolute(b64);
  cpu::grouped_gemm(problems_of(c, a64.data(), b64.data(), r.want.data(), GemmType::kF64, GemmType::kF64));
  Case abs_case = c;
  abs_case.alpha = std::abs(c.alpha), abs_case.beta = 0.f;
  cpu::grouped_gemm(problems_of(abs_case, a_abs.data(), b_abs.data(), r.bound.data(), GemmType::kF64, GemmType::kF64));
  const std::vector<double> a2_64 = widen(r.a2), b2_64 = widen(r.b2);
  if (dual) {  // + alpha A2 B2 into want, + |alpha| |A2||B2| into the bound
    const std::vector<double> a2_abs = absolute(a2_64), b2_abs = absolute(b2_64);
    Case add = c;
    add.beta = 1.f;
    cpu::grouped_gemm(second_of(add, a2_64.data(), b2_64.data(), r.want.data(), GemmType::kF64, GemmType::kF64));
    add.alpha = std::abs(c.alpha);
    cpu::grouped_gemm(second_of(add, a2_abs.data(), b2_abs.data(), r.bound.data(), GemmType::kF64, GemmType::kF64));
  }
  for (size_t i = 0; i < c_size; ++i)
    if (c.beta != 0.f && std::isfinite(r.want[i])) r.bound[i] += std::abs(double(c.beta) * double(to_acc(r.c0[i])));
  if (std::is_same_v<TC, bf16> && (c.beta != 0.f || dual)) {
    std::vector<double> p1(c_size, 0.0), p2(c_size, 0.0);
    Case product = c;
    product.beta = 0.f;
    cpu::grouped_gemm(problems_of(product, a64.data(), b64.data(), p1.data(), GemmType::kF64, GemmType::kF64));
    if (dual) cpu::grouped_gemm(second_of(product, a2_64.data(), b2_64.data(), p2.data(), GemmType::kF64, GemmType::kF64));
    r.loop_rounded.resize(c_size);
    for (size_t i = 0; i < c_size; ++i) {
      const double first_c = p1[i] + double(c.beta) * (c.beta != 0.f ? double(to_acc(r.c0[i])) : 0.0);
      r.loop_rounded[i] = (c.beta != 0.f ? std::abs(p1[i]) : 0.0) + (dual ? std::abs(first_c) + std::abs(p2[i]) : 0.0);
    }
  }
  r.covered.assign(c_size, 0);
  for (int64_t e = 0; e < experts; ++e) {
    if (c.offsets[e + 1] == c.offsets[e]) continue;
    const size_t begin = size_t(wgrad ? e * c.m * c.k : c.offsets[e] * c.m);
    const size_t end = size_t(wgrad ? (e + 1) * c.m * c.k : c.offsets[e + 1] * c.m);
    std::fill(r.covered.begin() + begin, r.covered.begin() + end, 1);
  }
  return r;
}

class GroupedGemmCuda : public CublasLtTest {
 protected:
  // Runs case c through `variant` and checks every element of C (and 256 elements past its end)
  // against the case's reference r:
  // - inside a problem, |got - want| <= 2^-14 (sum_k |a_ik b_kj| + |beta c0_ij|) (+ 2^-8 |want| for a
  //   bf16 C). The f32 accumulation of bf16 products (exact in f32) drifts from the f64 sum by at
  //   most ~K 2^-24 of that bound in the worst case and ~sqrt(K) 2^-24 for random signs: 2^-14
  //   leaves >= 16x room at the largest K here (2048 -> 2^-13 worst, ~2^-18.5 typical), while one
  //   missing, doubled or misplaced product term (|a b| ~ 1/4 of a sum of K/4) exceeds it. A bf16 C
  //   adds one rounding (2^-9 relative), doubled for results that straddle a rounding boundary.
  // - outside every problem (a weight-gradient expert without rows, the canary past the end), C
  //   keeps its initial bytes: NaN for beta 0, which must never be read where it is written.
  // tma_cluster > 0: the TMA-fed kernel (kernels/grouped_gemm_tma.h) with clusters of that many CTAs
  // instead of `variant` (row-grouped cases only).
  template <class TC>
  void check(const Case& c, const Reference<TC>& r, GroupedGemmVariant variant, int tma_cluster = 0) {
    const std::string what = describe(c) + " " +
                             (tma_cluster > 0 ? "sm90_tma cluster " + std::to_string(tma_cluster)
                                              : std::string(grouped_gemm_variant_name(variant)));
    const int64_t experts = static_cast<int64_t>(c.offsets.size()) - 1;
    const size_t c_size = r.want.size();
    const bool dual = c.k2 > 0;
    const bool loop_rounds = variant == GroupedGemmVariant::kLoop && !r.loop_rounded.empty();

    DeviceBuffer<bf16> a_d(r.a), b_d(r.b);
    DeviceBuffer<TC> c_d(r.c0);
    DeviceBuffer<void*> slots(std::max<size_t>(cuda::grouped_gemm_pointer_slots(size_t(experts)), 1));
    const cuda::GroupedGemmContext ctx{nullptr, handle_, GemmWorkspace{ws_->get(), kGemmWorkspaceBytes}, 0};
    const GemmType ct = std::is_same_v<TC, float> ? GemmType::kF32 : GemmType::kBF16;
    const std::vector<GemmArgs> problems = problems_of(c, a_d.get(), b_d.get(), c_d.get(), GemmType::kBF16, ct);
    ASSERT_EQ(sm90_grouped_unsupported(problems), nullptr) << what;
    DeviceBuffer<bf16> a2_d(dual ? r.a2 : std::vector<bf16>(1)), b2_d(dual ? r.b2 : std::vector<bf16>(1));
    if (tma_cluster > 0) {
      const RowGroupedGemm g = row_gemm_of(c, a_d.get(), b_d.get(), c_d.get(), GemmType::kBF16, ct);
      Case d = c;
      d.k = c.k2;
      const RowGroupedGemm g2 = row_gemm_of(d, a2_d.get(), b2_d.get(), c_d.get(), GemmType::kBF16, ct);
      ASSERT_EQ(sm90_tma_unsupported(g, dual ? &g2 : nullptr, c.offsets), nullptr) << what;
      cuda::sm90_grouped_gemm_tma(g, dual ? &g2 : nullptr, c.offsets, tma_cluster, 0, nullptr);
    } else if (dual) {
      const std::vector<GemmArgs> second = second_of(c, a2_d.get(), b2_d.get(), c_d.get(), GemmType::kBF16, ct);
      ASSERT_EQ(sm90_dual_unsupported(problems, second), nullptr) << what;
      cuda::grouped_gemm_dual(problems, second, variant, ctx, slots.get(), nullptr);
    } else {
      cuda::grouped_gemm(problems, variant, ctx, slots.get(), nullptr);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    const std::vector<TC> got = c_d.to_host();

    // A bf16 C is rounded once: half an ulp, at most 2^-8 of the value. The loop rounds more
    // (loop_rounded): on the H200 its bf16 accumulations missed by up to 1 ulp of the cancelled terms
    // (0.0078 for 0.0040 where alpha A B and C were near 0.5 and of opposite signs).
    const double rel = std::is_same_v<TC, float> ? 0.0 : 0x1p-8;
    int64_t bad = 0, worst = -1;
    double worst_excess = 0;
    for (size_t i = 0; i < c_size + kCanary; ++i) {
      bool ok;
      double excess = INFINITY;
      const double g = double(to_acc(got[i]));
      if (i >= c_size || !r.covered[i]) {
        const double w = double(to_acc(r.c0[i]));
        ok = std::isnan(w) ? std::isnan(g) : g == w;
      } else {
        const double lim =
            0x1p-14 * r.bound[i] + rel * (std::abs(r.want[i]) + (loop_rounds ? r.loop_rounded[i] : 0.0));
        const double err = std::abs(g - r.want[i]);
        ok = err <= lim;  // false for NaN
        if (!std::isnan(err)) excess = err - lim;
      }
      if (!ok) {
        if (bad == 0 || excess > worst_excess) worst = int64_t(i), worst_excess = excess;
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << what << ": worst element " << worst << " of " << c_size << " got "
                      << (worst >= 0 ? double(to_acc(got[worst])) : 0.0) << " want "
                      << (worst >= 0 && size_t(worst) < c_size ? r.want[worst] : 0.0);
  }

  template <class TC>
  void check_all_of(const Case& c) {
    const Reference<TC> r = reference_of<TC>(c);
    for (GroupedGemmVariant v : {GroupedGemmVariant::kSm90, GroupedGemmVariant::kSm90Wide, GroupedGemmVariant::kLoop})
      check<TC>(c, r, v);
    if (c.kind == Kind::kWeightGrad) return;  // the TMA kernel takes row-grouped products only
    for (int cluster : {1, 2}) check<TC>(c, r, GroupedGemmVariant::kAuto, cluster);
  }
  void check_all(const Case& c) {
    if (c.c_type == GemmType::kF32) check_all_of<float>(c);
    else check_all_of<bf16>(c);
  }

  void SetUp() override {
    CublasLtTest::SetUp();
    if (IsSkipped()) return;
    if (!cuda::sm90_grouped_gemm_ready()) GTEST_SKIP() << "the sm90 kernel needs an sm_90 GPU and an sm_90a build";
  }
};

// Rows per expert for E experts and about `rows` rows: uneven (a seeded log-normal load as a router
// leaves it), every seventh expert and the last without rows, and expert 1 with 1 row.
std::vector<int64_t> uneven(int64_t experts, int64_t rows, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d(0.0, 0.8);
  std::vector<int64_t> off{0};
  for (int64_t e = 0; e < experts; ++e) {
    int64_t r = int64_t(double(rows) / double(experts) * std::exp(d(gen)));
    if (experts > 1 && (e % 7 == 3 || e == experts - 1)) r = 0;
    if (e == 1) r = 1;
    off.push_back(off.back() + r);
  }
  return off;
}

// Every product kind, output type and beta at small shapes that end mid-tile everywhere: 8 experts
// with 0, 1, 7, 0, 13, 129 (a tile and one row), 200 and 64 rows; k = 72 and m = 136 (multiples of
// 8, not of the 64-deep k-step or the 128-wide tile).
TEST_F(GroupedGemmCuda, SmallEveryKindTypeAndBeta) {
  const std::vector<int64_t> off = {0, 0, 1, 8, 8, 21, 150, 350, 414};
  for (Kind kind : {Kind::kForward, Kind::kInputGrad, Kind::kWeightGrad})
    for (GemmType ct : {GemmType::kBF16, GemmType::kF32})
      for (float beta : {0.f, 1.f}) check_all({kind, off, 72, 136, ct, beta == 0.f ? 1.f : 0.5f, beta});
}

// One expert (E = 1): 300 rows, k = 200, m = 264; and k = 8 (one partial k-step).
TEST_F(GroupedGemmCuda, OneExpert) {
  for (Kind kind : {Kind::kForward, Kind::kInputGrad, Kind::kWeightGrad}) {
    check_all({kind, {0, 300}, 200, 264, GemmType::kBF16, 1.f, 0.f});
    check_all({kind, {0, 300}, 8, 16, GemmType::kF32, 1.f, 1.f});
  }
}

// A weight gradient whose experts have fewer rows than one k-step (the reduction ends inside the
// first step), and a forward where every expert has 1 row.
TEST_F(GroupedGemmCuda, TinyExperts) {
  check_all({Kind::kWeightGrad, {0, 1, 3, 3, 40, 45}, 64, 128, GemmType::kF32, 1.f, 0.f});
  check_all({Kind::kWeightGrad, {0, 1, 3, 3, 40, 45}, 64, 128, GemmType::kBF16, 1.f, 1.f});
  check_all({Kind::kForward, {0, 1, 2, 3, 4, 5, 6, 7, 8}, 512, 256, GemmType::kBF16, 1.f, 0.f});
}

// 128 experts of uneven sizes (some empty), several k-steps and tiles per expert.
TEST_F(GroupedGemmCuda, ManyExperts) {
  const std::vector<int64_t> off = uneven(128, 128 * 90, 3);
  for (Kind kind : {Kind::kForward, Kind::kInputGrad, Kind::kWeightGrad}) {
    check_all({kind, off, 256, 392, GemmType::kBF16, 1.f, 0.f});
    check_all({kind, off, 256, 392, GemmType::kF32, 1.f, 1.f});
  }
}

// Qwen3-30B-A3B's expert products at 1024 tokens x top-8 (8192 rows over 128 experts): gate_up
// (2048 -> 1536) forward, its input gradient and weight gradient, and down (768 -> 2048) forward.
TEST_F(GroupedGemmCuda, Qwen3LikeShapes) {
  const std::vector<int64_t> off = uneven(128, 8192, 5);
  check_all({Kind::kForward, off, 2048, 1536, GemmType::kBF16, 1.f, 0.f});
  check_all({Kind::kInputGrad, off, 1536, 2048, GemmType::kBF16, 1.f, 0.f});
  check_all({Kind::kWeightGrad, off, 2048, 1536, GemmType::kF32, 1.f, 1.f});
  check_all({Kind::kForward, off, 768, 2048, GemmType::kBF16, 1.f, 0.f});
}

// Dual lists (autograd/fn_grouped.cpp's LoRA forward x W^T + t B^T and input gradient dy W + dt A):
// a second depth of 16 (a quarter of a k-step) and of 72 (a k-step and a partial one), beta 0 and 1,
// bf16 and f32 C, at small uneven shapes and at Qwen3's gate_up with rank 16.
TEST_F(GroupedGemmCuda, DualProductsIntoOneOutput) {
  const std::vector<int64_t> off = {0, 0, 1, 8, 8, 21, 150, 350, 414};
  for (Kind kind : {Kind::kForward, Kind::kInputGrad})
    for (int64_t k2 : {16, 72})
      for (float beta : {0.f, 1.f}) {
        check_all({kind, off, 72, 136, GemmType::kBF16, beta == 0.f ? 1.f : 0.5f, beta, k2});
        check_all({kind, off, 72, 136, GemmType::kF32, 1.f, beta, k2});
      }
  const std::vector<int64_t> qwen = uneven(128, 8192, 5);
  check_all({Kind::kForward, qwen, 2048, 1536, GemmType::kBF16, 1.f, 0.f, 16});
  check_all({Kind::kInputGrad, qwen, 1536, 2048, GemmType::kBF16, 1.f, 0.f, 16});
}

}  // namespace
}  // namespace loom::test
