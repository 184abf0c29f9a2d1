// cuBLASLt GEMM against the CPU (Eigen) reference: every transpose pair, batched strides, beta,
// odd sizes and leading dimensions, misaligned pointers, broadcast, the descriptor cache, and the timed
// algorithm choice (whose trials must leave C as it was: it is read when beta != 0).
#include <cublasLt.h>

#include <cstring>
#include <limits>

#include "kernels/gemm.h"
#include "tests/kernels/cublaslt_test.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

struct Case {
  int64_t m, n, k, batch;
  bool ta, tb;
  int64_t pad;     // extra elements per row (ld = row + pad) and between batch items
  int64_t offset;  // elements the A/B/C pointers are moved past their allocation (misalignment)
  float alpha, beta;
};

template <class T>
GemmType type_of() { return std::is_same_v<T, bf16> ? GemmType::kBF16 : GemmType::kF32; }

class GemmCudaTest : public CublasLtTest {
 protected:
  // Runs one case on both backends; returns the relative L2 error of the [m, n] blocks of C.
  template <class AB, class C>
  // apart (with beta != 0): C is read from a buffer of its own (GemmArgs::c_in), the output buffer
  // poisoned, and C_in must come out as it went in.
  double run(const Case& cs, uint32_t seed, bool with_workspace = true,
             cuda::GemmAlgoChoice choice = cuda::GemmAlgoChoice::kHeuristic, bool apart = false) {
    GemmArgs g;
    g.m = cs.m; g.n = cs.n; g.k = cs.k; g.batch = cs.batch;
    g.trans_a = cs.ta; g.trans_b = cs.tb;
    const int64_t a_rows = cs.ta ? cs.k : cs.m, a_cols = cs.ta ? cs.m : cs.k;
    const int64_t b_rows = cs.tb ? cs.n : cs.k, b_cols = cs.tb ? cs.k : cs.n;
    g.lda = a_cols + cs.pad; g.ldb = b_cols + cs.pad; g.ldc = cs.n + cs.pad;
    g.stride_a = a_rows * g.lda + cs.pad; g.stride_b = b_rows * g.ldb + cs.pad; g.stride_c = cs.m * g.ldc + cs.pad;
    g.ab_type = type_of<AB>(); g.c_type = type_of<C>();
    g.alpha = cs.alpha; g.beta = cs.beta;
    const auto a = random_vec<AB>(cs.offset + g.stride_a * cs.batch, seed);
    const auto b = random_vec<AB>(cs.offset + g.stride_b * cs.batch, seed + 1);
    auto c = random_vec<C>(cs.offset + g.stride_c * cs.batch, seed + 2);
    DeviceBuffer<AB> da(a), db(b);
    // beta == 0: C starts as NaN on the device (DeviceBuffer's poison), which must never be read.
    DeviceBuffer<C> dc(c.size()), dc_in(apart ? c.size() : 1);
    if (cs.beta != 0.f)
      EXPECT_EQ(cudaMemcpy(apart ? dc_in.get() : dc.get(), c.data(), c.size() * sizeof(C), cudaMemcpyHostToDevice),
                cudaSuccess);
    else
      std::fill(c.begin(), c.end(), from_acc<C>(std::numeric_limits<float>::quiet_NaN()));

    const std::vector<C> c_before = c;  // C_in's contents (the CPU's product below runs in place on c)
    GemmArgs hg = g;
    hg.a = a.data() + cs.offset; hg.b = b.data() + cs.offset; hg.c = c.data() + cs.offset;
    cpu::gemm(hg);
    GemmArgs dg = g;
    dg.a = da.get() + cs.offset; dg.b = db.get() + cs.offset; dg.c = dc.get() + cs.offset;
    if (apart) dg.c_in = dc_in.get() + cs.offset;
    GemmWorkspace ws{with_workspace ? static_cast<void*>(ws_->get()) : nullptr,
                     with_workspace ? kGemmWorkspaceBytes : 0};
    cuda::gemm(dg, handle_, ws, nullptr, choice);
    const auto out = dc.to_host();
    if (apart && cs.beta != 0.f) {
      const auto in_after = dc_in.to_host();
      EXPECT_EQ(std::memcmp(in_after.data(), c_before.data(), c_before.size() * sizeof(C)), 0) << "C_in was written";
    }
    std::vector<float> got, ref;
    for (int64_t bi = 0; bi < g.batch; ++bi)
      for (int64_t i = 0; i < g.m; ++i)
        for (int64_t j = 0; j < g.n; ++j) {
          const int64_t at = cs.offset + bi * g.stride_c + i * g.ldc + j;
          got.push_back(to_acc(out[at]));
          ref.push_back(to_acc(c[at]));
        }
    return rel_error(got, ref);
  }

  template <class AB, class C>
  void sweep(double tol, int64_t pad, int64_t offset,
             cuda::GemmAlgoChoice choice = cuda::GemmAlgoChoice::kHeuristic) {
    const int64_t sizes[][3] = {{1, 1, 1}, {7, 33, 129}, {129, 7, 33}, {33, 129, 7}, {64, 48, 80}, {200, 136, 264}};
    uint32_t seed = 300;
    int idx = 0;
    for (const auto& s : sizes)
      for (int t = 0; t < 4; ++t, ++idx) {
        const bool ta = t & 1, tb = t & 2;
        const Case single{s[0], s[1], s[2], 1, ta, tb, pad, offset, 1.f, 0.f};
        const Case batched{s[0], s[1], s[2], 3, ta, tb, pad, offset, idx % 2 ? -0.75f : 1.5f, idx % 3 ? 0.5f : 0.f};
        for (const Case& cs : {single, batched})
          EXPECT_LT((run<AB, C>(cs, seed += 10, true, choice)), tol)
              << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " batch=" << cs.batch << " ta=" << cs.ta
              << " tb=" << cs.tb << " pad=" << pad << " offset=" << offset << " beta=" << cs.beta;
      }
  }
};

// Tolerances (relative L2 vs the CPU): f32 differs only in summation order (CUBLAS_COMPUTE_32F
// without TF32 — TF32 would show up as ~1e-3 and fail); bf16 x bf16 products are exact in f32, so
// bf16->f32 is order-only too; bf16 outputs add one rounding of 2^-9 (see kernel_test_util.h).
TEST_F(GemmCudaTest, F32MatchesCpu) { sweep<float, float>(1e-5, 0, 0); }
TEST_F(GemmCudaTest, Bf16ToBf16MatchesCpu) { sweep<bf16, bf16>(tol<bf16>(), 0, 0); }
TEST_F(GemmCudaTest, Bf16ToF32MatchesCpu) { sweep<bf16, float>(1e-5, 0, 0); }

// Odd leading dimensions (rows not 16-byte aligned) and pointers one element past an aligned
// allocation: the heuristic must pick algorithms that cope (alignment is part of the cache key).
TEST_F(GemmCudaTest, F32OddLeadingDimensionsAndMisalignedPointers) { sweep<float, float>(1e-5, 3, 1); }
TEST_F(GemmCudaTest, Bf16OddLeadingDimensionsAndMisalignedPointers) { sweep<bf16, bf16>(tol<bf16>(), 3, 1); }
TEST_F(GemmCudaTest, Bf16ToF32OddLeadingDimensions) { sweep<bf16, float>(1e-5, 1, 3); }

TEST_F(GemmCudaTest, WorksWithoutWorkspace) {
  EXPECT_LT((run<bf16, bf16>({257, 129, 1031, 2, false, true, 0, 0, 1.f, 0.f}, 11, false)), tol<bf16>());
  EXPECT_LT((run<float, float>({64, 4096, 4096, 1, false, false, 0, 0, 1.f, 0.f}, 12, false)), 1e-5);
}

// kTimed: the shape's first call times several algorithms (in place on a scratch copy of C) before its
// own run; with beta != 0 the trials must not have touched C. Every transpose pair, batched, odd leading
// dimensions, and transformer-sized products with many candidates, each on a first and a cached call.
TEST_F(GemmCudaTest, TimedChoiceMatchesCpu) {
  sweep<bf16, bf16>(tol<bf16>(), 0, 0, cuda::GemmAlgoChoice::kTimed);
  sweep<bf16, float>(1e-5, 3, 1, cuda::GemmAlgoChoice::kTimed);
  sweep<float, float>(1e-5, 0, 0, cuda::GemmAlgoChoice::kTimed);
  // beta 1 (its own timed plan, the trials in place on a copy of C: C must come out with one product
  // added, not one a trial), then beta 0 of the same shape (another plan, timed again).
  for (float beta : {1.f, 0.f})
    for (uint32_t seed : {41u, 42u}) {
      const Case cs{1024, 2048, 512, 1, false, true, 0, 0, 1.f, beta};
      EXPECT_LT((run<bf16, bf16>(cs, seed + uint32_t(beta), true, cuda::GemmAlgoChoice::kTimed)), tol<bf16>())
          << "beta " << beta << " seed " << seed;
      const Case dgrad{2048, 512, 1024, 1, false, false, 0, 0, 1.f, beta};
      EXPECT_LT((run<bf16, bf16>(dgrad, seed + 7, true, cuda::GemmAlgoChoice::kTimed)), tol<bf16>())
          << "beta " << beta << " seed " << seed;
    }
}

// C read apart from the output (GemmArgs::c_in, cuBLASLt's C and D): accumulating cases of every transpose
// pair, odd leading dimensions and misaligned pointers, heuristic and timed (the trials too must read C_in
// and leave it alone), and the merged-weight shape of the LoRA backward ([out, 3r] x [3r, in] + W).
TEST_F(GemmCudaTest, ReadsCApartFromTheOutput) {
  uint32_t seed = 500;
  for (auto choice : {cuda::GemmAlgoChoice::kHeuristic, cuda::GemmAlgoChoice::kTimed})
    for (int t = 0; t < 4; ++t)
      for (int64_t pad : {0, 3}) {
        const Case cs{129, 200, 33, pad ? 1 : 2, bool(t & 1), bool(t & 2), pad, pad ? 1 : 0, 1.5f, pad ? 0.5f : 1.f};
        EXPECT_LT((run<bf16, bf16>(cs, seed += 10, true, choice, true)), tol<bf16>()) << "t=" << t << " pad=" << pad;
        EXPECT_LT((run<bf16, float>(cs, seed += 10, true, choice, true)), 1e-5) << "t=" << t << " pad=" << pad;
      }
  EXPECT_LT((run<bf16, bf16>({2048, 8192, 48, 1, false, false, 0, 0, 2.f, 1.f}, 77, true,
                             cuda::GemmAlgoChoice::kHeuristic, true)),
            tol<bf16>());
}

// A transformer-sized product through the cache twice, the second call hitting the cached plan
// with different data: both must match the CPU.
TEST_F(GemmCudaTest, CachedPlanIsReused) {
  const Case cs{512, 1024, 768, 1, false, true, 0, 0, 1.f, 0.f};
  EXPECT_LT((run<bf16, bf16>(cs, 21)), tol<bf16>());
  EXPECT_LT((run<bf16, bf16>(cs, 22)), tol<bf16>());
}

// Stride 0 broadcasts B over the batch (a shared weight applied to every item).
TEST_F(GemmCudaTest, BroadcastsBWithZeroStride) {
  const int64_t m = 17, n = 40, k = 24, batch = 5;
  const auto a = random_vec<float>(batch * m * k, 31), b = random_vec<float>(k * n, 32);
  std::vector<float> c(batch * m * n);
  GemmArgs g;
  g.m = m; g.n = n; g.k = k; g.batch = batch;
  g.lda = k; g.stride_a = m * k; g.ldb = n; g.stride_b = 0; g.ldc = n; g.stride_c = m * n;
  g.a = a.data(); g.b = b.data(); g.c = c.data();
  cpu::gemm(g);
  DeviceBuffer<float> da(a), db(b), dc(c.size());
  g.a = da.get(); g.b = db.get(); g.c = dc.get();
  cuda::gemm(g, handle_, {ws_->get(), kGemmWorkspaceBytes}, nullptr);
  EXPECT_LT(rel_error(dc.to_host(), c), 1e-5);
}

TEST_F(GemmCudaTest, RejectsF64AndMalformedArguments) {
  DeviceBuffer<float> d(64);
  GemmArgs g;
  g.m = g.n = g.k = 4;
  g.lda = g.ldb = g.ldc = 4;
  g.a = g.b = g.c = d.get();
  g.ab_type = g.c_type = GemmType::kF64;
  EXPECT_THROW(cuda::gemm(g, handle_, {ws_->get(), kGemmWorkspaceBytes}, nullptr), Error);
  g.ab_type = g.c_type = GemmType::kF32;
  g.ldc = 3;
  EXPECT_THROW(cuda::gemm(g, handle_, {ws_->get(), kGemmWorkspaceBytes}, nullptr), Error);
  g.ldc = 4;
  EXPECT_THROW(cuda::gemm(g, handle_, {ws_->get() + 4, 1024}, nullptr), Error);
}

}  // namespace
}  // namespace loom::test
