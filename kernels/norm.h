// RMSNorm forward and backward (Llama/Qwen `w`, Gemma `1 + w`): y = x * rstd * g with
// rstd = 1 / sqrt(mean(x^2) + eps) per row. Statistics and the weight gradient are kept in Acc<T>
// (f32, or f64 for the CPU double instantiation used by finite-difference tests).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/common.h"

namespace loom::cpu {
// x, y [rows, cols]; w [cols]; rstd [rows] (written; may be nullptr when no backward follows).
// g = add_one ? 1 + w : w. y = x * rstd * g, computed in Acc<T>, rounded once to T. ldy: y's row
// stride (0: cols; more leaves columns after each row untouched, e.g. for a LoRA product's input).
template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, Acc<T>* rstd, int64_t rows, int64_t cols, float eps,
                      bool add_one, int64_t ldy = 0);
// dx [rows, cols] is overwritten; dw [cols] is accumulated into (+=) and may be nullptr (frozen
// weight). rstd is what the forward saved.
//   dx = rstd * g * dy - x * rstd^3 / cols * sum_j(dy_j g_j x_j);   dw_j += sum_rows dy_j x_j rstd
template <class T>
void rms_norm_backward(const T* x, const T* w, const Acc<T>* rstd, const T* dy, T* dx, Acc<T>* dw, int64_t rows,
                       int64_t cols, bool add_one);
}  // namespace loom::cpu

namespace loom::cuda {
// Same contracts as loom::cpu (T = float or bf16, statistics and dw in f32). One block per row.
// With residual and sum (both or neither): the norm of h = x + residual (rounded to T, the unfused
// add's value), h written to sum [rows, cols]: the residual add fused into the norm's pass.
template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, float* rstd, int64_t rows, int64_t cols, float eps,
                      bool add_one, Stream s, const T* residual = nullptr, T* sum = nullptr, int64_t ldy = 0);
// Scratch for the deterministic weight gradient (per-block partial column sums, f32). With
// dw = nullptr no workspace is needed (pass nullptr). cols * 4 bytes of shared memory per block
// must fit the device's opt-in limit (~58k columns on H100/H200); a loom::Error says otherwise.
size_t rms_norm_backward_workspace_bytes(int64_t rows, int64_t cols);
// dres (nullable, [rows, cols]): the gradient x also gets by another path (the residual stream),
// added to dx: dx = T(dres + T(dx)), the bits the separate addition gives.
template <class T>
void rms_norm_backward(const T* x, const T* w, const float* rstd, const T* dy, T* dx, float* dw, int64_t rows,
                       int64_t cols, bool add_one, void* workspace, Stream s, const T* dres = nullptr);
}  // namespace loom::cuda
