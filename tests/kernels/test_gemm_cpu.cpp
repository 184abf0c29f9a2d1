// CPU GEMM (Eigen) against a naive f64 triple loop: every transpose pair, batches with padded
// strides, beta != 0, padded leading dimensions and odd sizes, for f32, bf16->bf16, bf16->f32, f64.
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/gemm.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

struct Case {
  int64_t m, n, k, batch;
  bool ta, tb;
  int64_t pad;  // extra elements per row (ld = row + pad) and between batch items
  float alpha, beta;
};

// Storage for one GEMM in the element types AB and C, with the descriptor pointing into it.
template <class AB, class C>
struct Problem {
  GemmArgs g;
  std::vector<AB> a, b;
  std::vector<C> c;
};

template <class T>
GemmType type_of() {
  return std::is_same_v<T, bf16> ? GemmType::kBF16 : std::is_same_v<T, double> ? GemmType::kF64 : GemmType::kF32;
}

template <class AB, class C>
Problem<AB, C> make_problem(const Case& cs, uint32_t seed) {
  Problem<AB, C> p;
  GemmArgs& g = p.g;
  g.m = cs.m; g.n = cs.n; g.k = cs.k; g.batch = cs.batch;
  g.trans_a = cs.ta; g.trans_b = cs.tb;
  const int64_t a_rows = cs.ta ? cs.k : cs.m, a_cols = cs.ta ? cs.m : cs.k;
  const int64_t b_rows = cs.tb ? cs.n : cs.k, b_cols = cs.tb ? cs.k : cs.n;
  g.lda = a_cols + cs.pad; g.ldb = b_cols + cs.pad; g.ldc = cs.n + cs.pad;
  g.stride_a = a_rows * g.lda + cs.pad; g.stride_b = b_rows * g.ldb + cs.pad; g.stride_c = cs.m * g.ldc + cs.pad;
  p.a = random_vec<AB>(g.stride_a * cs.batch, seed);
  p.b = random_vec<AB>(g.stride_b * cs.batch, seed + 1);
  p.c = random_vec<C>(g.stride_c * cs.batch, seed + 2);
  if (cs.beta == 0.f) std::fill(p.c.begin(), p.c.end(), from_acc<C>(Acc<C>(std::numeric_limits<float>::quiet_NaN())));
  g.a = p.a.data(); g.b = p.b.data(); g.c = p.c.data();
  g.ab_type = type_of<AB>(); g.c_type = type_of<C>();
  g.alpha = cs.alpha; g.beta = cs.beta;
  return p;
}

// The [m, n] block of every batch item of C, packed, in double.
template <class C>
std::vector<double> gather_c(const GemmArgs& g, const std::vector<C>& c) {
  std::vector<double> out;
  for (int64_t bi = 0; bi < g.batch; ++bi)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) out.push_back(double(to_acc(c[bi * g.stride_c + i * g.ldc + j])));
  return out;
}

// Naive f64: C[b](i, j) = alpha * sum_l op(A)(i, l) op(B)(l, j) + beta * C[b](i, j), from the
// definition of row-major storage, written independently of the kernel.
template <class AB, class C>
std::vector<double> naive(const Problem<AB, C>& p) {
  const GemmArgs& g = p.g;
  std::vector<double> out;
  for (int64_t bi = 0; bi < g.batch; ++bi)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double acc = 0;
        for (int64_t l = 0; l < g.k; ++l) {
          const int64_t ai = g.trans_a ? l * g.lda + i : i * g.lda + l;
          const int64_t bj = g.trans_b ? j * g.ldb + l : l * g.ldb + j;
          acc += double(to_acc(p.a[bi * g.stride_a + ai])) * double(to_acc(p.b[bi * g.stride_b + bj]));
        }
        double v = double(g.alpha) * acc;
        if (g.beta != 0.f) v += double(g.beta) * double(to_acc(p.c[bi * g.stride_c + i * g.ldc + j]));
        out.push_back(v);
      }
  return out;
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  // {301, 37, 70} and {37, 301, 70} are above the CPU GEMM's threading threshold (2^18
  // multiply-adds): C split into row blocks (m >= n) or column blocks, with a ragged last block.
  // {2, 1031, 257}: bf16's few-rows path (m <= 8) above the threshold, its last block of 16 columns
  // ragged and k not a multiple of its 16 lanes.
  const int64_t sizes[][3] = {{1, 1, 1},    {7, 33, 129},  {129, 7, 33},  {33, 129, 7},  {64, 48, 80},
                              {1, 129, 33}, {301, 37, 70}, {37, 301, 70}, {2, 1031, 257}};
  int idx = 0;
  for (const auto& s : sizes)
    for (int t = 0; t < 4; ++t, ++idx) {
      const bool ta = t & 1, tb = t & 2;
      cs.push_back({s[0], s[1], s[2], 1, ta, tb, 0, 1.f, 0.f});
      cs.push_back({s[0], s[1], s[2], 3, ta, tb, 3, idx % 2 ? -0.75f : 1.5f, idx % 3 ? 0.5f : 0.f});
    }
  return cs;
}

// Tolerance on relative L2 error vs exact f64: f32 accumulation over k <= 129 terms of magnitude
// <= 1 gives ~sqrt(k) * 2^-24 relative (~1e-6); bf16 outputs add one 2^-9 rounding (~4e-3 rms).
template <class AB, class C>
void run_all(double tol) {
  uint32_t seed = 100;
  for (const Case& cs : cases()) {
    auto p = make_problem<AB, C>(cs, seed += 10);
    const auto ref = naive(p);
    cpu::gemm(p.g);
    const double err = rel_error(gather_c(p.g, p.c), ref);
    EXPECT_LT(err, tol) << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " batch=" << cs.batch
                        << " ta=" << cs.ta << " tb=" << cs.tb << " beta=" << cs.beta;
  }
}

// C read apart from where the result goes (GemmArgs::c_in): D = alpha op(A) op(B) + beta C_in into c
// (NaN before), C_in left as it was; every accumulating case of the sweep (the few-rows path among
// them) against the naive product of C_in.
template <class AB, class C>
void run_apart(double tol) {
  uint32_t seed = 700;
  for (const Case& cs : cases()) {
    if (cs.beta == 0.f) continue;
    auto p = make_problem<AB, C>(cs, seed += 10);
    const auto ref = naive(p);
    const std::vector<C> c_in = p.c, before = p.c;
    std::fill(p.c.begin(), p.c.end(), from_acc<C>(Acc<C>(std::numeric_limits<float>::quiet_NaN())));
    p.g.c_in = c_in.data();
    cpu::gemm(p.g);
    EXPECT_LT(rel_error(gather_c(p.g, p.c), ref), tol) << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k
                                                      << " batch=" << cs.batch << " ta=" << cs.ta << " tb=" << cs.tb;
    EXPECT_EQ(std::memcmp(c_in.data(), before.data(), c_in.size() * sizeof(C)), 0) << "C_in was written";
  }
}

TEST(GemmCpu, ReadsCApartFromTheOutput) {
  run_apart<float, float>(1e-5);
  run_apart<bf16, bf16>(8e-3);
  run_apart<bf16, float>(1e-5);
}

TEST(GemmCpu, F32MatchesNaive) { run_all<float, float>(1e-5); }
TEST(GemmCpu, Bf16ToBf16MatchesNaive) { run_all<bf16, bf16>(8e-3); }
TEST(GemmCpu, Bf16ToF32MatchesNaive) { run_all<bf16, float>(1e-5); }
TEST(GemmCpu, F64MatchesNaive) { run_all<double, double>(1e-13); }  // f64 order differences only

TEST(GemmCpu, BroadcastsAWithZeroStride) {
  auto p = make_problem<float, float>({5, 9, 17, 4, false, true, 0, 1.f, 0.f}, 7);
  p.g.stride_a = 0;  // the same A for every batch item
  const auto ref = naive(p);
  cpu::gemm(p.g);
  EXPECT_LT(rel_error(gather_c(p.g, p.c), ref), 1e-5);
}

TEST(GemmCpu, RejectsMalformedArguments) {
  auto p = make_problem<float, float>({4, 5, 6, 1, false, false, 0, 1.f, 0.f}, 9);
  GemmArgs g = p.g;
  g.lda = 5;  // stored A is 4x6
  EXPECT_THROW(cpu::gemm(g), Error);
  g = p.g;
  g.trans_b = true;  // stored B would be 5x6, but ldb = 5
  EXPECT_THROW(cpu::gemm(g), Error);
  g = p.g;
  g.k = 0;
  EXPECT_THROW(cpu::gemm(g), Error);
  g = p.g;
  g.c_type = GemmType::kBF16;  // f32 inputs with a bf16 output is not a supported pair
  EXPECT_THROW(cpu::gemm(g), Error);
  g = p.g;
  g.batch = 2;
  g.stride_c = 0;
  EXPECT_THROW(cpu::gemm(g), Error);
  g = p.g;
  g.m = 0;  // an empty output is a no-op
  EXPECT_NO_THROW(cpu::gemm(g));
}

}  // namespace
}  // namespace loom::test
