// CUDA kernels for kernels/bf16_split.h: one thread per output element.
#include "kernels/bf16_split.h"
#include "kernels/cuda/cuda_common.cuh"

namespace loom::cuda {
namespace {

__global__ void bf16_split_kernel(const float* x, bf16* out, int64_t rows, int64_t k, SplitPattern pattern, int64_t ld) {
  const int m = pattern.count;
  const int64_t n = rows * m * k;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % k, rp = i / k, p = rp % m, r = rp / m;
    out[r * ld + p * k + j] = float_to_bf16(bf16_split_part(x[r * k + j], pattern.parts[p]));
  }
}

__global__ void block_sum_kernel(const float* in, float* out, int64_t rows, int64_t k, int m, float alpha) {
  const int64_t n = rows * k;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % k, r = i / k;
    float s = 0.f;
    for (int p = 0; p < m; ++p) s += in[(r * m + p) * k + j];
    out[i] = alpha * s;
  }
}

// One thread per (row, column) of the sum: its m blocks added as block_sum_kernel does, then every
// part of both patterns written (consecutive threads, consecutive columns of each block).
__global__ void block_sum_split_kernel(const float* in, int64_t ldi, int64_t rows, int64_t k, int m, float alpha,
                                       bf16* out_a, SplitPattern a, int64_t lda, bf16* out_b, SplitPattern b,
                                       int64_t ldb) {
  const int64_t n = rows * k;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % k, r = i / k;
    float s = 0.f;
    for (int p = 0; p < m; ++p) s += in[r * ldi + p * k + j];
    s = __fmul_rn(alpha, s);  // rounded here, as block_sum stores it: never contracted into the split's subtraction
    for (int p = 0; p < a.count; ++p) out_a[r * lda + p * k + j] = float_to_bf16(bf16_split_part(s, a.parts[p]));
    if (out_b)
      for (int p = 0; p < b.count; ++p) out_b[r * ldb + p * k + j] = float_to_bf16(bf16_split_part(s, b.parts[p]));
  }
}

}  // namespace

void block_sum_split(const float* in, int64_t rows, int64_t k, int m, float alpha, bf16* out_a, SplitPattern a,
                     bf16* out_b, SplitPattern b, Stream s, int64_t ld_a, int64_t ld_b, int64_t ld_in) {
  LOOM_CHECK(m >= 1, "block_sum_split: at least one block, got ", m);
  LOOM_CHECK(a.count >= 1 && a.count <= kMaxSplitParts && (!out_b || (b.count >= 1 && b.count <= kMaxSplitParts)),
             "block_sum_split: 1 to 4 parts per pattern, got ", a.count, " and ", b.count);
  const int64_t lda = ld_a > 0 ? ld_a : a.count * k, ldb = ld_b > 0 ? ld_b : b.count * k;
  const int64_t ldi = ld_in > 0 ? ld_in : m * k;
  LOOM_CHECK(lda >= a.count * k && (!out_b || ldb >= b.count * k) && ldi >= m * k, "block_sum_split: row pitches ",
             lda, ", ", ldb, " and ", ldi, " (in) shorter than a row's ", a.count * k, ", ", b.count * k, " and ", m * k);
  if (rows * k == 0) return;
  block_sum_split_kernel<<<blocks_for(rows * k, 256), 256, 0, s>>>(in, ldi, rows, k, m, alpha, out_a, a, lda, out_b, b,
                                                                   ldb);
  LOOM_CUDA_LAUNCH_CHECK();
}

void bf16_split(const float* x, bf16* out, int64_t rows, int64_t k, SplitPattern pattern, Stream s, int64_t ld_out) {
  LOOM_CHECK(pattern.count >= 1 && pattern.count <= kMaxSplitParts, "bf16_split: 1 to 4 parts, got ", pattern.count);
  const int64_t ld = ld_out > 0 ? ld_out : pattern.count * k;
  LOOM_CHECK(ld >= pattern.count * k, "bf16_split: row pitch ", ld, " shorter than a row's ", pattern.count * k, " parts");
  const int64_t n = rows * pattern.count * k;
  if (n == 0) return;
  bf16_split_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x, out, rows, k, pattern, ld);
  LOOM_CUDA_LAUNCH_CHECK();
}

void block_sum(const float* in, float* out, int64_t rows, int64_t k, int m, float alpha, Stream s) {
  LOOM_CHECK(m >= 1, "block_sum: at least one block, got ", m);
  if (rows * k == 0) return;
  block_sum_kernel<<<blocks_for(rows * k, 256), 256, 0, s>>>(in, out, rows, k, m, alpha);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace loom::cuda
