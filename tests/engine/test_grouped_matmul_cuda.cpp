// The grouped products of MoE layers on CUDA, every variant (one cublasGemmGroupedBatchedEx call,
// one cuBLASLt call per expert, Loom's sm90 kernel for bf16 inputs; named through
// engine/ops_grouped.h) and the automatic choice, against
// the CPU reference on the same values, expert by expert: f32, bf16 and bf16 -> f32, at a small shape
// with experts without rows and at Qwen3-30B-A3B's (128 experts, uneven routing counts, some zero,
// 65536 rows, 2048 -> 1536): forward, input gradient (alpha, beta = 1) and weight gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/ops.h"
#include "engine/ops_grouped.h"

namespace loom::test {
namespace {

#define LOOM_REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

// Uniform values in [-1, 1) that bf16 holds exactly: f32 and bf16 inputs carry the same numbers, so
// one f32 CPU reference serves every dtype.
Tensor bf16_exact(const Shape& s, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(numel_of(s));
  for (auto& x : v) x = bf16_to_float(float_to_bf16(d(gen)));
  return Tensor::from_floats(v, s);
}

// Expert counts as a random softmax routing leaves them (log-normal weights), every ninth expert and
// the last one without rows; rows in total.
std::vector<int64_t> uneven_offsets(int64_t experts, int64_t rows, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> w(experts);
  double total = 0;
  for (int64_t e = 0; e < experts; ++e) total += w[e] = (e % 9 == 4 || e == experts - 1) ? 0.0 : std::exp(d(gen));
  std::vector<int64_t> offsets{0};
  for (int64_t e = 0; e < experts; ++e) offsets.push_back(offsets.back() + int64_t(double(rows) * w[e] / total));
  const int64_t rest = rows - offsets.back();  // the rounding's leftover rows go to expert 0
  for (int64_t e = 1; e <= experts; ++e) offsets[e] += rest;
  return offsets;
}

// Relative L2 error of each expert's block of got against want (rows [off[e], off[e+1]) of width
// `width` for row-grouped outputs, the e-th [M, K] block for weight gradients); an all-zero block
// must come back all zero.
void expect_experts_near(const Tensor& got_t, const Tensor& want_t, const std::vector<int64_t>& off, bool row_grouped,
                         double tol, const std::string& what) {
  ASSERT_TRUE(got_t.is_cuda()) << what;
  const std::vector<float> got = got_t.to(DType::f32).to_floats(), want = want_t.to_floats();
  ASSERT_EQ(got.size(), want.size()) << what;
  const int64_t experts = static_cast<int64_t>(off.size()) - 1;
  const int64_t width = row_grouped ? want_t.size(-1) : want_t.size(1) * want_t.size(2);
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = row_grouped ? off[e] * width : e * width;
    const int64_t end = row_grouped ? off[e + 1] * width : (e + 1) * width;
    double num = 0, den = 0;
    for (int64_t i = begin; i < end; ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << what << " expert " << e << " element " << i;
      num += double(got[i] - want[i]) * (got[i] - want[i]);
      den += double(want[i]) * want[i];
    }
    if (den == 0) EXPECT_EQ(num, 0) << what << " expert " << e;
    else EXPECT_LT(std::sqrt(num / den), tol) << what << " expert " << e << " (" << off[e + 1] - off[e] << " rows)";
  }
}

struct Types {
  DType in, out;
  // f32 output: f32 accumulation in another order than the CPU's, ~sqrt(K) 2^-24 relative. bf16
  // output: each side rounds its f32 result to bf16 once (2^-9 relative at most, ~2^-10 on average).
  double tol;
};
const Types kTypes[] = {{DType::f32, DType::f32, 2e-5}, {DType::bf16, DType::bf16, 4e-3}, {DType::bf16, DType::f32, 2e-5}};
// kSm90Tma: the TMA-fed kernel for the row-grouped products (y, dx), the rule's pick for dw.
const GroupedGemmVariant kVariants[] = {GroupedGemmVariant::kLoop, GroupedGemmVariant::kCublasGrouped,
                                        GroupedGemmVariant::kSm90, GroupedGemmVariant::kSm90Wide,
                                        GroupedGemmVariant::kSm90Tma, GroupedGemmVariant::kAuto};

// x [N, K], w [E, M, K], dy [N, M]: y = x w_e^T, dx = 0.5 dy w_e + dx0, dw[e] = dy^T x (into NaNs,
// beta 0: experts without rows must come back zero).
void check(int64_t n, int64_t k, int64_t m, const std::vector<int64_t>& off) {
  const int64_t experts = static_cast<int64_t>(off.size()) - 1;
  const Tensor x = bf16_exact({n, k}, 1), w = bf16_exact({experts, m, k}, 2), dy = bf16_exact({n, m}, 3);
  const Tensor dx0 = bf16_exact({n, k}, 4);
  Tensor y_ref = Tensor::empty({n, m}, DType::f32), dx_ref = dx0.clone(), dw_ref = Tensor::empty({experts, m, k}, DType::f32);
  ops::grouped_matmul_into(x, w, y_ref, off, true);
  ops::grouped_matmul_into(dy, w, dx_ref, off, false, 0.5f, 1.f);
  ops::grouped_matmul_tn_into(dy, x, dw_ref, off);
  const Device gpu = Device::cuda(0);
  for (const Types& t : kTypes) {
    const Tensor xg = x.to(gpu, t.in), wg = w.to(gpu, t.in), dyg = dy.to(gpu, t.in);
    for (GroupedGemmVariant v : kVariants) {
      const std::string what = std::string(name(t.in)) + "->" + std::string(name(t.out)) + " " +
                               grouped_gemm_variant_name(v) + " " + std::to_string(experts) + " experts";
      Tensor y = Tensor::empty({n, m}, t.out, gpu), dx = dx0.to(gpu, t.out);
      Tensor dw = Tensor::empty({experts, m, k}, t.out, gpu);
      ops::fill_(dw, NAN);
      if (v == GroupedGemmVariant::kCublasGrouped && t.in != t.out) {  // cuBLAS has no bf16 -> f32
        EXPECT_THROW(ops::detail::grouped_matmul_into(xg, wg, y, off, true, 1.f, 0.f, v), Error) << what;
        continue;
      }
      const bool sm90 =
          v == GroupedGemmVariant::kSm90 || v == GroupedGemmVariant::kSm90Wide || v == GroupedGemmVariant::kSm90Tma;
      if (sm90 && (t.in != DType::bf16 || !cuda::sm90_grouped_gemm_ready())) {
        // bf16 operands only, on a Hopper (elsewhere it refuses whatever it is given)
        EXPECT_THROW(ops::detail::grouped_matmul_into(xg, wg, y, off, true, 1.f, 0.f, v), Error) << what;
        continue;
      }
      ops::detail::grouped_matmul_into(xg, wg, y, off, true, 1.f, 0.f, v);
      ops::detail::grouped_matmul_into(dyg, wg, dx, off, false, 0.5f, 1.f, v);
      ops::detail::grouped_matmul_tn_into(dyg, xg, dw, off, 1.f, 0.f, v);
      expect_experts_near(y, y_ref, off, true, t.tol, "y " + what);
      expect_experts_near(dx, dx_ref, off, true, t.tol, "dx " + what);
      expect_experts_near(dw, dw_ref, off, false, t.tol, "dw " + what);
    }
  }
}

TEST(GroupedMatmulCuda, SmallWithEmptyExperts) {
  LOOM_REQUIRE_CUDA();
  check(40, 64, 48, {0, 0, 7, 7, 20, 33, 40, 40});
}

TEST(GroupedMatmulCuda, Qwen3MoeShapes) {
  LOOM_REQUIRE_CUDA();
  const std::vector<int64_t> off = uneven_offsets(128, 65536, 5);
  ASSERT_EQ(off.back(), 65536);
  check(65536, 2048, 1536, off);
}

// Rows of 5 bf16 values put experts' pointers off 16 bytes: the automatic choice runs the loop, and
// cuBLAS's grouped call and the sm90 kernel, asked for by name, are refused.
TEST(GroupedMatmulCuda, UnalignedRowsTakeTheLoop) {
  LOOM_REQUIRE_CUDA();
  const std::vector<int64_t> off = {0, 3, 3, 10};
  const Tensor x = bf16_exact({10, 5}, 6), w = bf16_exact({3, 8, 5}, 7);
  Tensor ref = Tensor::empty({10, 8}, DType::f32);
  ops::grouped_matmul_into(x, w, ref, off, true);
  const Device gpu = Device::cuda(0);
  Tensor y = Tensor::empty({10, 8}, DType::bf16, gpu);
  ops::grouped_matmul_into(x.to(gpu, DType::bf16), w.to(gpu, DType::bf16), y, off, true);
  expect_experts_near(y, ref, off, true, 4e-3, "auto");
  EXPECT_THROW(ops::detail::grouped_matmul_into(x.to(gpu, DType::bf16), w.to(gpu, DType::bf16), y, off, true, 1.f,
                                                0.f, GroupedGemmVariant::kCublasGrouped),
               Error);
  EXPECT_THROW(ops::detail::grouped_matmul_into(x.to(gpu, DType::bf16), w.to(gpu, DType::bf16), y, off, true, 1.f,
                                                0.f, GroupedGemmVariant::kSm90),
               Error);
}

}  // namespace
}  // namespace loom::test
