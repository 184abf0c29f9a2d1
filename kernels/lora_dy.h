// The two skinny products a LoRA backward takes of its output gradient dy, in one pass over dy:
//   dt = sum_p dy b_p          [n, out] x [out, r]  -> [n, r]    (the adapter's inner gradient)
//   db = alpha sum_p dy^T t_p  [out, n] x [n, r]    -> [out, r]  (lora_B's gradient)
// where b_p and t_p are the p-th column blocks of r of b [out, m r] and t [n, m r]: the bf16 hi and
// lo parts of B and of t = x A^T (kernels/bf16_split.h), summed as they enter. As two GEMMs each reads
// all of dy, the largest tensor of the backward for gate and up ([tokens, intermediate]); the CUDA
// kernel reads it once and sums its per-block partial products in a fixed order (deterministic).
#pragma once
#include <cstdint>

#include "kernels/common.h"

namespace loom::cpu {
// dy [n, out] bf16 (row pitch ld_dy), b [out, m r] bf16 (row pitch ld_b), t [n, m r] bf16 (row pitch
// ld_t); dt [n, r] and db [out, r] f32, contiguous. f32 accumulation.
void lora_dy_products(const bf16* dy, int64_t ld_dy, const bf16* b, int64_t ld_b, const bf16* t, int64_t ld_t,
                      int64_t n, int64_t out, int64_t r, int m, float alpha, float* dt, float* db);
}  // namespace loom::cpu

namespace loom::cuda {
// Whether the kernel takes these operands: m r <= 128 and a multiple of 8, out a multiple of 8, and
// every row of dy, b and t starting on 16 bytes (pointers and pitches). Otherwise the caller computes
// the two products as GEMMs.
bool lora_dy_products_supported(const bf16* dy, int64_t ld_dy, const bf16* b, int64_t ld_b, const bf16* t, int64_t ld_t,
                                int64_t out, int64_t r, int m);
// f32 scratch the kernel needs for its partial sums (a caller-owned device buffer of this many floats).
int64_t lora_dy_products_workspace(int64_t n, int64_t out, int64_t r, int m);
void lora_dy_products(const bf16* dy, int64_t ld_dy, const bf16* b, int64_t ld_b, const bf16* t, int64_t ld_t,
                      int64_t n, int64_t out, int64_t r, int m, float alpha, float* dt, float* db, float* workspace,
                      Stream s);
}  // namespace loom::cuda
