// f32 values carried through bf16 GEMMs at nearly f32 precision: x = hi + lo with hi = bf16(x) and
// lo = bf16(x - hi) (16 significant bits). The LoRA path (autograd/fn_lora.cpp) concatenates such
// parts along the reduction dimension of a skinny product, so a bf16 GEMM with f32 accumulation
// computes sum(hi*h' + lo*h' + hi*l') and loses only the lo*lo' term; block_sum adds up the
// products of separate parts afterwards.
#pragma once
#include <cstdint>

#include "kernels/common.h"

namespace loom {
// Up to 4 parts: 'h' (hi) or 'l' (lo) per output block.
inline constexpr int kMaxSplitParts = 4;
struct SplitPattern {
  char parts[kMaxSplitParts] = {};
  int count = 0;
};

LOOM_HD float bf16_split_part(float x, char part) {
  const float hi = bf16_to_float(float_to_bf16(x));
  return part == 'h' ? hi : x - hi;  // rounded to bf16 by the caller's store
}

// One block_sum_split among several run together (block_sum_split_batch): in [rows, m * k] f32 (row
// pitch ldi), alpha, pattern a into out_a (row pitch lda) and, where out_b is set, b into out_b (ldb).
// Pitches are whole (no 0 = packed here). The LoRA products' parameter-only splits (A's and B's parts,
// s B beside W) are such jobs: one launch for all of a layer's projections that read one x.
struct SplitJob {
  const float* in = nullptr;
  bf16* out_a = nullptr;
  bf16* out_b = nullptr;
  int64_t rows = 0, k = 0, ldi = 0, lda = 0, ldb = 0;
  float alpha = 1.f;
  int m = 1;
  SplitPattern a, b;
};
inline constexpr int kMaxSplitJobs = 12;  // per launch (the CUDA kernel takes them as its parameter)
}  // namespace loom

namespace loom::cpu {
// out [rows, count * k] bf16: block p of row r is part p of x [rows, k] (f32). ld_out: out's row
// pitch in elements (0: count * k; larger writes into a row-strided view, e.g. a weight's spare columns).
void bf16_split(const float* x, bf16* out, int64_t rows, int64_t k, SplitPattern pattern, int64_t ld_out = 0);
// out [rows, k] f32 = alpha * sum over the m blocks of in [rows, m * k] (f32).
void block_sum(const float* in, float* out, int64_t rows, int64_t k, int m, float alpha);
// block_sum, then bf16_split of its result with pattern a into out_a [rows, a.count * k] and, when
// out_b is not null, with pattern b into out_b: the same values as the three calls, in one pass,
// without the f32 sum in memory (the sum starts from the first block, block_sum's from +0: only the sign
// of a zero sum can differ; one block, alpha 1 gives bf16_split's bits, -0 included). ld_a, ld_b: out_a's and out_b's row pitch in elements (0: count * k);
// ld_in: in's (0: m * k; larger reads a column block of a wider matrix, e.g. one adapter's of several).
void block_sum_split(const float* in, int64_t rows, int64_t k, int m, float alpha, bf16* out_a, SplitPattern a,
                     bf16* out_b, SplitPattern b, int64_t ld_a = 0, int64_t ld_b = 0, int64_t ld_in = 0);
// Every job as block_sum_split (the same bits), one after the other.
void block_sum_split_batch(const SplitJob* jobs, int count);
}  // namespace loom::cpu

namespace loom::cuda {
void bf16_split(const float* x, bf16* out, int64_t rows, int64_t k, SplitPattern pattern, Stream s, int64_t ld_out = 0);
void block_sum(const float* in, float* out, int64_t rows, int64_t k, int m, float alpha, Stream s);
void block_sum_split(const float* in, int64_t rows, int64_t k, int m, float alpha, bf16* out_a, SplitPattern a,
                     bf16* out_b, SplitPattern b, Stream s, int64_t ld_a = 0, int64_t ld_b = 0, int64_t ld_in = 0);
// Every job as block_sum_split (the same bits), kMaxSplitJobs a launch.
void block_sum_split_batch(const SplitJob* jobs, int count, Stream s);
}  // namespace loom::cuda
