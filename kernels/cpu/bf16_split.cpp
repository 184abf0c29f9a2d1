// CPU reference for kernels/bf16_split.h.
#include "kernels/bf16_split.h"

namespace loom::cpu {

void bf16_split(const float* x, bf16* out, int64_t rows, int64_t k, SplitPattern pattern, int64_t ld_out) {
  LOOM_CHECK(pattern.count >= 1 && pattern.count <= kMaxSplitParts, "bf16_split: 1 to 4 parts, got ", pattern.count);
  const int m = pattern.count;
  const int64_t ld = ld_out > 0 ? ld_out : m * k;
  LOOM_CHECK(ld >= m * k, "bf16_split: row pitch ", ld, " shorter than a row's ", m * k, " parts");
#pragma omp parallel for if (rows * k > 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int p = 0; p < m; ++p)
      for (int64_t j = 0; j < k; ++j)
        out[r * ld + p * k + j] = float_to_bf16(bf16_split_part(x[r * k + j], pattern.parts[p]));
}

void block_sum(const float* in, float* out, int64_t rows, int64_t k, int m, float alpha) {
  LOOM_CHECK(m >= 1, "block_sum: at least one block, got ", m);
#pragma omp parallel for if (rows * k > 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      float s = 0.f;
      for (int p = 0; p < m; ++p) s += in[(r * m + p) * k + j];
      out[r * k + j] = alpha * s;
    }
}

void block_sum_split(const float* in, int64_t rows, int64_t k, int m, float alpha, bf16* out_a, SplitPattern a,
                     bf16* out_b, SplitPattern b, int64_t ld_a, int64_t ld_b, int64_t ld_in) {
  LOOM_CHECK(m >= 1, "block_sum_split: at least one block, got ", m);
  LOOM_CHECK(a.count >= 1 && a.count <= kMaxSplitParts && (!out_b || (b.count >= 1 && b.count <= kMaxSplitParts)),
             "block_sum_split: 1 to 4 parts per pattern, got ", a.count, " and ", b.count);
  const int64_t lda = ld_a > 0 ? ld_a : a.count * k, ldb = ld_b > 0 ? ld_b : b.count * k;
  const int64_t ldi = ld_in > 0 ? ld_in : m * k;
  LOOM_CHECK(lda >= a.count * k && (!out_b || ldb >= b.count * k) && ldi >= m * k, "block_sum_split: row pitches ",
             lda, ", ", ldb, " and ", ldi, " (in) shorter than a row's ", a.count * k, ", ", b.count * k, " and ", m * k);
#pragma omp parallel for if (rows * k > 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      float s = in[r * ldi + j];  // the first block as it is (a -0 stays -0, as bf16_split keeps it)
      for (int p = 1; p < m; ++p) s += in[r * ldi + p * k + j];
      s = alpha * s;
      for (int p = 0; p < a.count; ++p) out_a[r * lda + p * k + j] = float_to_bf16(bf16_split_part(s, a.parts[p]));
      if (out_b)
        for (int p = 0; p < b.count; ++p) out_b[r * ldb + p * k + j] = float_to_bf16(bf16_split_part(s, b.parts[p]));
    }
}

void block_sum_split_batch(const SplitJob* jobs, int count) {
  for (int i = 0; i < count; ++i) {
    const SplitJob& j = jobs[i];
    block_sum_split(j.in, j.rows, j.k, j.m, j.alpha, j.out_a, j.a, j.out_b, j.b, j.lda, j.ldb, j.ldi);
  }
}

}  // namespace loom::cpu
