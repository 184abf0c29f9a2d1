// Mixture-of-experts routing and combining (Mixtral, Qwen3-MoE), as transformers computes them:
// the router's softmax over the experts in f32, the top k of it, renormalised to sum 1 where the
// config says (Mixtral always, Qwen3 by norm_topk_prob); the tokens' rows grouped by expert for one
// GEMM per expert (engine/ops.h moe_dispatch), and each token's expert outputs summed back,
// weighted by its routing weights.
#pragma once
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
