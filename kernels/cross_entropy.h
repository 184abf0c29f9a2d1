// Softmax cross-entropy over a vocabulary, forward and backward, with ignored targets and optional
// final-logit soft-capping (Gemma 2). T is float, double (CPU only) or bf16; the log-sum-exp and
// losses are Acc<T>.
#pragma once
#include <cstdint>

#include "kernels/common.h"

namespace loom {
// Hugging Face / PyTorch default label for positions that carry no loss.
inline constexpr int32_t kIgnoreIndex = -100;
}  // namespace loom

namespace loom::cpu {
// logits [n, vocab], targets [n]; z = softcap > 0 ? softcap * tanh(logit / softcap) : logit.
// lse[i] = log sum_v exp(z[i, v]) for every row; loss[i] = lse[i] - z[i, t_i], 0 where
// t_i == ignore_index. A target outside [0, vocab) that is not ignore_index throws loom::Error.
template <class T>
void cross_entropy_forward(const T* logits, const int32_t* targets, Acc<T>* loss, Acc<T>* lse, int64_t n,
                           int64_t vocab, float softcap, int32_t ignore_index);
// dlogits[i, :] = dloss[i] * (softmax(z_i) - onehot(t_i)) * dz/dlogit; zero rows where ignored.
template <class T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const Acc<T>* lse, const Acc<T>* dloss,
                            T* dlogits, int64_t n, int64_t vocab, float softcap, int32_t ignore_index);
}  // namespace loom::cpu

namespace loom::cuda {
// As the CPU versions, except that a target outside [0, vocab) is treated as ignored (a kernel
// cannot throw); such rows never read out of bounds. One block per row; any vocab size.
template <class T>
void cross_entropy_forward(const T* logits, const int32_t* targets, float* loss, float* lse, int64_t n,
                           int64_t vocab, float softcap, int32_t ignore_index, Stream s);
template <class T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const float* lse, const float* dloss,
                            T* dlogits, int64_t n, int64_t vocab, float softcap, int32_t ignore_index, Stream s);
}  // namespace loom::cuda
