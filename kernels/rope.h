// Rotary position embedding in the Hugging Face rotate-half layout, over packed token rows with
// explicit positions, plus the host-side default inv_freq table (the scaling rules that models
// apply to it live in models/rope_scaling.h).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/common.h"

namespace loom::cpu {
// inv_freq [head_dim / 2] as transformers computes it in float32 on the CPU (same op sequence):
// 1 / theta^(2i / head_dim), unscaled.
std::vector<float> rope_inv_freq(int64_t head_dim, double theta);

// x, y [tokens, heads, head_dim]; positions [tokens]; inv_freq [rotary_dim / 2]. Only the first
// rotary_dim (even, <= head_dim) entries of a head rotate (transformers' partial_rotary_factor); the
// rest pass through. With h = rotary_dim/2, for i < h: a = float(pos) * inv_freq[i] (f32, as Hugging
// Face), c = cos(a) * mscale, s = sin(a) * mscale (mscale: LongRoPE's attention scaling, else 1),
//   y[i] = x[i] c - x[i+h] s;   y[i+h] = x[i+h] c + x[i] s;   y[j] = x[j] for rotary_dim <= j.
// x == y (in place) is allowed.
template <class T>
void rope_forward(const T* x, T* y, const int32_t* positions, const float* inv_freq, int64_t tokens, int64_t heads,
                  int64_t head_dim, int64_t rotary_dim, float mscale);
// The transpose: dx[i] = dy[i] c + dy[i+h] s;  dx[i+h] = dy[i+h] c - dy[i] s;  dx[j] = dy[j]. In place allowed.
template <class T>
void rope_backward(const T* dy, T* dx, const int32_t* positions, const float* inv_freq, int64_t tokens,
                   int64_t heads, int64_t head_dim, int64_t rotary_dim, float mscale);
}  // namespace loom::cpu

namespace loom::cuda {
template <class T>
void rope_forward(const T* x, T* y, const int32_t* positions, const float* inv_freq, int64_t tokens, int64_t heads,
                  int64_t head_dim, int64_t rotary_dim, float mscale, Stream s);
template <class T>
void rope_backward(const T* dy, T* dx, const int32_t* positions, const float* inv_freq, int64_t tokens,
                   int64_t heads, int64_t head_dim, int64_t rotary_dim, float mscale, Stream s);
// q and k (the same tokens and head_dim, their own head counts) rotated in one launch, each angle's
// sine and cosine computed once for both: rope_forward (or rope_backward) of each, the same bits.
// k_heads = 0 rotates q alone.
template <class T>
void rope_pair(const T* q, T* q_out, int64_t q_heads, const T* k, T* k_out, int64_t k_heads, const int32_t* positions,
               const float* inv_freq, int64_t tokens, int64_t head_dim, int64_t rotary_dim, float mscale, bool backward,
               Stream s);
}  // namespace loom::cuda
