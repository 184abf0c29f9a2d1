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

// One job's element i (row i / k, column i % k of the sum): its m blocks added, then every part of both
// patterns written (consecutive threads, consecutive columns of each block).
__device__ __forceinline__ void sum_split_one(const SplitJob& jb, int64_t i) {
  const int64_t k = jb.k, j = i % k, r = i / k;
  const float* in = jb.in + r * jb.ldi + j;
  float s = in[0];  // the first block as it is (a -0 stays -0, as bf16_split keeps it)
  for (int p = 1; p < jb.m; ++p) s += in[p * k];
  s = __fmul_rn(jb.alpha, s);  // rounded here, as block_sum stores it: never contracted into the split's subtraction
  for (int p = 0; p < jb.a.count; ++p) jb.out_a[r * jb.lda + p * k + j] = float_to_bf16(bf16_split_part(s, jb.a.parts[p]));
  if (jb.out_b)
    for (int p = 0; p < jb.b.count; ++p) jb.out_b[r * jb.ldb + p * k + j] = float_to_bf16(bf16_split_part(s, jb.b.parts[p]));
}

// Up to kMaxSplitJobs jobs, their elements numbered one after the other (job t's from start[t]).
struct SplitJobs {
  SplitJob job[kMaxSplitJobs];
  int64_t start[kMaxSplitJobs + 1];
  int count;
};

__global__ void block_sum_split_batch_kernel(const __grid_constant__ SplitJobs jobs) {
  const int64_t n = jobs.start[jobs.count];
  int t = 0;  // a thread's elements only increase: its job index too
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    while (i >= jobs.start[t + 1]) ++t;
    sum_split_one(jobs.job[t], i - jobs.start[t]);
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
  SplitJob jb;  // a batch of one: one kernel for both
  jb.in = in, jb.out_a = out_a, jb.out_b = out_b, jb.rows = rows, jb.k = k, jb.ldi = ldi, jb.lda = lda, jb.ldb = ldb;
  jb.alpha = alpha, jb.m = m, jb.a = a, jb.b = b;
  block_sum_split_batch(&jb, 1, s);
}

void block_sum_split_batch(const SplitJob* jobs, int count, Stream s) {
  for (int first = 0; first < count; first += kMaxSplitJobs) {
    SplitJobs batch{};
    batch.count = 0;
    batch.start[0] = 0;
    for (int i = first; i < count && i < first + kMaxSplitJobs; ++i) {
      const SplitJob& j = jobs[i];
      LOOM_CHECK(j.m >= 1 && j.a.count >= 1 && j.a.count <= kMaxSplitParts &&
                     (!j.out_b || (j.b.count >= 1 && j.b.count <= kMaxSplitParts)) && j.lda >= j.a.count * j.k &&
                     (!j.out_b || j.ldb >= j.b.count * j.k) && j.ldi >= j.m * j.k,
                 "block_sum_split_batch: job ", i, " has ", j.m, " blocks, patterns of ", j.a.count, " and ", j.b.count,
                 " parts, row pitches ", j.lda, ", ", j.ldb, " and ", j.ldi, " (in) for rows of ", j.k);
      if (j.rows * j.k == 0) continue;
      batch.job[batch.count] = j;
      batch.start[batch.count + 1] = batch.start[batch.count] + j.rows * j.k;
      ++batch.count;
    }
    if (batch.count == 0) continue;
    block_sum_split_batch_kernel<<<blocks_for(batch.start[batch.count], 256), 256, 0, s>>>(batch);
    LOOM_CUDA_LAUNCH_CHECK();
  }
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
