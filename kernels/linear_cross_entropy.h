// Fused linear + softmax cross-entropy (lm_head + loss) that never materialises the [n, vocab]
// logits: rows go in chunks through logits = h W^T, a per-row log-sum-exp / loss / dlogits pass,
// and dh = dlogits W, dW += dlogits^T h. Gradients are produced in the same pass as the loss.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/common.h"
#include "kernels/gemm.h"

namespace loom {
// Rows per chunk so that one chunk's logits (logit_bytes each) stay <= 512 MiB, a multiple of 128
// (GEMM tiles) when that allows more than 128 rows; at least 1. bf16 logits give twice the rows of
// f32 ones: half as many chunks, so half as many passes over an f32 dW (2 GiB for Llama-3's head).
inline int64_t linear_cross_entropy_default_chunk_rows(int64_t vocab, int64_t logit_bytes = 4) {
  const int64_t budget = (int64_t(512) << 20) / (logit_bytes > 0 ? logit_bytes : 4);
  int64_t rows = vocab > 0 ? budget / vocab : 1;
  if (rows >= 256) rows -= rows % 128;
  return rows < 1 ? 1 : rows;
}
// Logits come in the inputs' type: bf16 inputs give bf16 logits (rounded once from the f32
// accumulation, then read in f32), as transformers computes them (its lm_head is a bf16 Linear; the
// loss upcasts its output) and Unsloth's fused loss does; f32 and f64 inputs keep theirs in their
// own type. f32 logits for bf16 inputs (once an environment option) doubled the bytes of the CUDA
// row pass: 7.0 ms a step against 4.2 with bf16 logits, H200, `bench/e2e/run.sh 1b`
// (bench/results/2026-12-02-h200-session19.md).
// Bytes of one logit in a chunk's buffer for inputs in bf16 (bf16_input) or f32.
inline int64_t linear_cross_entropy_logit_bytes(bool bf16_input) { return bf16_input ? 2 : 4; }
// The rows of one chunk: chunk_rows when > 0, else the default for the logit size; at most n.
inline int64_t linear_cross_entropy_chunk_rows(int64_t n, int64_t vocab, int64_t chunk_rows, bool bf16_input) {
  const int64_t rows = chunk_rows > 0 ? chunk_rows
                                      : linear_cross_entropy_default_chunk_rows(vocab, linear_cross_entropy_logit_bytes(bf16_input));
  return rows < n ? rows : n;
}
}  // namespace loom

namespace loom::cpu {
// h [n, hidden], w [vocab, hidden], targets [n]; z = softcap > 0 ? softcap * tanh(l / softcap) : l
// with l = h w^T (rounded to bf16 for bf16 inputs, as above). *loss = mean over rows with
// t_i != ignore_index of lse_i - z[i, t_i] (0 when every row is ignored). dh [n, hidden] (nullable) gets d loss / d h; dw [vocab, hidden] (nullable)
// gets d loss / d w (overwritten: the first chunk's GEMM has beta 0, later ones accumulate in
// Acc<T>, so no zero-fill pass is needed). chunk_rows <= 0 picks the default.
// A target outside [0, vocab) that is not ignore_index throws loom::Error naming the row.
template <class T>
void linear_cross_entropy(const T* h, const T* w, const int32_t* targets, Acc<T>* loss, T* dh, Acc<T>* dw,
                          int64_t n, int64_t vocab, int64_t hidden, float softcap, int32_t ignore_index,
                          int64_t chunk_rows);
// x[i] *= *scalar for i < n (the backward's upstream-gradient scale).
template <class T>
void scale_by_scalar(T* x, const Acc<T>* scalar, int64_t n);
}  // namespace loom::cpu

namespace loom::cuda {
// Device scratch linear_cross_entropy needs for inputs in bf16 (bf16_input) or f32: 256 B for the
// row scale, n floats of per-row losses and one chunk's logits, linear_cross_entropy_chunk_rows x
// vocab x linear_cross_entropy_logit_bytes (dlogits overwrite them in place in T).
size_t linear_cross_entropy_scratch_bytes(int64_t n, int64_t vocab, int64_t chunk_rows, bool bf16_input);
// As the CPU version with T = float or bf16 (GEMMs: T in, f32 accumulate; dh in T, dw in f32),
// except that a target outside [0, vocab) is treated as ignored. loss is one device float; the
// row scale 1/count is counted on the device (no host synchronisation). scratch holds at least
// linear_cross_entropy_scratch_bytes(n, vocab, chunk_rows, T is bf16) bytes, 256-byte aligned.
template <class T>
void linear_cross_entropy(const T* h, const T* w, const int32_t* targets, float* loss, T* dh, float* dw, int64_t n,
                          int64_t vocab, int64_t hidden, float softcap, int32_t ignore_index, int64_t chunk_rows,
                          void* scratch, cublasLtHandle_t handle, GemmWorkspace ws, Stream s);
// x[i] *= *scalar (a device float) for i < n.
template <class T>
void scale_by_scalar(T* x, const float* scalar, int64_t n, Stream s);
}  // namespace loom::cuda
