// Rotary position embedding in the Hugging Face rotate-half layout, over packed token rows with
// explicit positions, plus the host-side inv_freq table (default, linear and Llama 3 scaling).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/common.h"

namespace loom {

// Mirrors transformers' `rope_scaling` / `rope_parameters` for the kinds Loom supports.
struct RopeScaling {
  enum class Kind { kDefault, kLinear, kLlama3 } kind = Kind::kDefault;
  double factor = 1;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  double original_max_position_embeddings = 8192;
};

}  // namespace loom

namespace loom::cpu {
// inv_freq [head_dim / 2] as transformers computes it in float32 on the CPU (same op sequence):
// 1 / theta^(2i / head_dim), then the scaling rule (`_compute_llama3_parameters` for kLlama3).
std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& s);

// x, y [tokens, heads, head_dim]; positions [tokens]; inv_freq [head_dim / 2]. With h = head_dim/2,
// for i < h: a = float(pos) * inv_freq[i] (f32, as Hugging Face), c = cos a, s = sin a,
//   y[i] = x[i] c - x[i+h] s;   y[i+h] = x[i+h] c + x[i] s.
// x == y (in place) is allowed.
template <class T>
void rope_forward(const T* x, T* y, const int32_t* positions, const float* inv_freq, int64_t tokens, int64_t heads,
                  int64_t head_dim);
// The transpose rotation: dx[i] = dy[i] c + dy[i+h] s;  dx[i+h] = dy[i+h] c - dy[i] s. In place allowed.
template <class T>
void rope_backward(const T* dy, T* dx, const int32_t* positions, const float* inv_freq, int64_t tokens,
                   int64_t heads, int64_t head_dim);
}  // namespace loom::cpu

namespace loom::cuda {
template <class T>
void rope_forward(const T* x, T* y, const int32_t* positions, const float* inv_freq, int64_t tokens, int64_t heads,
                  int64_t head_dim, Stream s);
template <class T>
void rope_backward(const T* dy, T* dx, const int32_t* positions, const float* inv_freq, int64_t tokens,
                   int64_t heads, int64_t head_dim, Stream s);
// q and k (the same tokens and head_dim, their own head counts) rotated in one launch, each angle's
// sine and cosine computed once for both: rope_forward (or rope_backward) of each, the same bits.
// k_heads = 0 rotates q alone.
template <class T>
void rope_pair(const T* q, T* q_out, int64_t q_heads, const T* k, T* k_out, int64_t k_heads, const int32_t* positions,
               const float* inv_freq, int64_t tokens, int64_t head_dim, bool backward, Stream s);
}  // namespace loom::cuda
