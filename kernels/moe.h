// Mixture-of-experts routing and combining (Mixtral, Qwen3-MoE), as transformers computes them:
// the router's softmax over the experts in f32, the top k of it, renormalised to sum 1 where the
// config says (Mixtral always, Qwen3 by norm_topk_prob); the tokens' rows grouped by expert for one
// GEMM per expert (engine/ops.h moe_dispatch), and each token's expert outputs summed back,
// weighted by its routing weights.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/common.h"

namespace loom::cpu {
// logits [T, E] -> ids [T, K] (the experts, largest probability first; equal ones: the lower
// expert first) and weights [T, K] (their probabilities, divided by the K's sum when renorm).
// F: float, or double for finite-difference tests.
template <class F>
void moe_route_forward(const F* logits, int32_t* ids, F* weights, int64_t tokens, int64_t experts, int64_t k,
                       bool renorm);
// dlogits [T, E] (overwritten) from dweights [T, K]: through the renormalised softmax of the chosen
// logits (renorm), or the softmax over all experts.
template <class F>
void moe_route_backward(const F* logits, const int32_t* ids, const F* weights, const F* dweights, F* dlogits,
                        int64_t tokens, int64_t experts, int64_t k, bool renorm);
// transformers' load_balancing_loss_func over N tokens (every layer's, concatenated): with p_t the
// softmax of token t's logits and c_e how many of the N K choices went to expert e, its
// tokens_per_expert [K, E] summed over K is c_e / N, so the loss is E * sum_e (c_e / N) mean_t p_te.
// Returns the loss; dlogits [N, E] (when not null) gets its gradient times dloss (the choices are
// constants).
template <class F>
F moe_aux_loss(const F* logits, const int32_t* ids, int64_t tokens, int64_t experts, int64_t k, F dloss, F* dlogits);

// y[t, :] = sum over j < K of w[t, j] * ys[row_of[t K + j], :] (summed in Acc<T>); ys [N, H], y [T, H].
template <class T>
void moe_combine_forward(const T* ys, const int32_t* row_of, const Acc<T>* w, T* y, int64_t tokens, int64_t k,
                         int64_t h);
// dys[row_of[t K + j], :] = w[t, j] * dy[t, :] (every row of dys written: N = T K), and
// dw[t, j] = <ys[row_of[t K + j], :], dy[t, :]> in Acc<T>.
template <class T>
void moe_combine_backward(const T* ys, const int32_t* row_of, const Acc<T>* w, const T* dy, T* dys, Acc<T>* dw,
                          int64_t tokens, int64_t k, int64_t h);
}  // namespace loom::cpu

namespace loom::cuda {
// The most experts and the largest k the CUDA kernels take: a warp holds a token's logits, at most
// 32 per lane, and lane j holds its j-th choice.
inline constexpr int64_t kMoeMaxExperts = 1024, kMoeMaxK = 32;

// As the CPU versions, in f32, one warp per token: the same ids (ties: the lower expert first) and
// weights within a few ulps (expf and the softmax's sum differ in rounding). Ids outside [0, E)
// in the backward touch nothing (a kernel cannot throw).
void moe_route_forward(const float* logits, int32_t* ids, float* weights, int64_t tokens, int64_t experts, int64_t k,
                       bool renorm, Stream s);
void moe_route_backward(const float* logits, const int32_t* ids, const float* weights, const float* dweights,
                        float* dlogits, int64_t tokens, int64_t experts, int64_t k, bool renorm, Stream s);

// The load-balancing loss into *loss (device) and its gradient for the device scalar *dloss, as
// the CPU version; ids outside [0, E) are not counted. Deterministic: integer counts, the
// probabilities summed per block of tokens and then over the blocks in a fixed order. workspace:
// moe_aux_loss_workspace_bytes (the backward needs its first part only).
size_t moe_aux_loss_workspace_bytes(int64_t tokens, int64_t experts);
void moe_aux_loss(const float* logits, const int32_t* ids, int64_t tokens, int64_t experts, int64_t k, float* loss,
                  void* workspace, Stream s);
void moe_aux_loss_backward(const float* logits, const int32_t* ids, int64_t tokens, int64_t experts, int64_t k,
                           const float* dloss, float* dlogits, void* workspace, Stream s);

// engine/ops.h moe_dispatch on the device: the n = T K assignments ids [n] grouped by expert,
// stably, exactly as the CPU loop groups them: token_of_row [n], row_of [n], offsets [E + 1]
// (int64, device). Assignments whose expert is outside [0, E) get no row, so offsets[E] < n tells
// the caller. Deterministic (integer counts per chunk of assignments, then a stable scatter).
// workspace: moe_dispatch_workspace_bytes.
size_t moe_dispatch_workspace_bytes(int64_t assignments, int64_t experts);
void moe_dispatch(const int32_t* ids, int64_t assignments, int64_t k, int64_t experts, int32_t* token_of_row,
                  int32_t* row_of, int64_t* offsets, void* workspace, Stream s);

// As the CPU versions (T = float or bf16, weights f32), one block per token, no atomics: y and dys
// are the CPU's bits (products and sums rounded as the CPU rounds them), dw is a block reduction
// (a different summation order). Rows outside [0, T K) are skipped (dw 0).
template <class T>
void moe_combine_forward(const T* ys, const int32_t* row_of, const float* w, T* y, int64_t tokens, int64_t k,
                         int64_t h, Stream s);
template <class T>
void moe_combine_backward(const T* ys, const int32_t* row_of, const float* w, const T* dy, T* dys, float* dw,
                          int64_t tokens, int64_t k, int64_t h, Stream s);
}  // namespace loom::cuda
