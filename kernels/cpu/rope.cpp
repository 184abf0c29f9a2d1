// CPU reference for kernels/rope.h: the rotate-half rotation and its transpose, and the host-side
// default inv_freq table reproducing transformers' float32 arithmetic.
#include "kernels/rope.h"

#include "kernels/cpu/rope_angles.h"

#include <cmath>

namespace loom::cpu {

std::vector<float> rope_inv_freq(int64_t head_dim, double theta) {
  LOOM_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope_inv_freq: head_dim must be even and positive, got ",
             head_dim);
  LOOM_CHECK(theta > 0, "rope_inv_freq: theta must be positive, got ", theta);
  const int64_t half = head_dim / 2;
  // transformers: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), all float32 tensor ops
  // with the python scalars rounded to float32. torch's pow is Sleef's (1 ulp), ours is libm's, so
  // an entry may rarely differ in the last bit; every later step is exactly torch's.
  std::vector<float> inv(half);
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / std::pow(base, expo);
  }
  return inv;
}

namespace {

// kSign = +1: forward rotation; -1: its transpose (the backward).
template <class T, int kSign>
void rope_apply(const T* in, T* out, const int32_t* positions, const float* inv_freq, int64_t tokens, int64_t heads,
                int64_t head_dim, int64_t rotary_dim, float mscale) {
  using A = Acc<T>;
  LOOM_CHECK(tokens >= 0 && heads > 0 && head_dim > 0 && head_dim % 2 == 0, "rope: bad shape [", tokens, ", ",
             heads, ", ", head_dim, "] (head_dim must be even)");
  LOOM_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim, "rope: rotary_dim ", rotary_dim,
             " must be even, positive and at most head_dim ", head_dim);
  const int64_t half = rotary_dim / 2;
  if (in != out && rotary_dim < head_dim) {  // the pass-through part of every head
    for (int64_t r = 0; r < tokens * heads; ++r)
      for (int64_t j = rotary_dim; j < head_dim; ++j) out[r * head_dim + j] = in[r * head_dim + j];
  }
#pragma omp parallel for if (tokens * heads * head_dim > 65536)
  for (int64_t t = 0; t < tokens; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      A c, sn;
      rope_cos_sin<kSign>(pos, inv_freq[i], mscale, c, sn);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = (t * heads + h) * head_dim;
        const A x1 = to_acc(in[base + i]), x2 = to_acc(in[base + i + half]);
        out[base + i] = from_acc<T>(x1 * c - x2 * sn);
        out[base + i + half] = from_acc<T>(x2 * c + x1 * sn);
      }
    }
  }
}

}  // namespace

template <class T>
void rope_forward(const T* x, T* y, const int32_t* positions, const float* inv_freq, int64_t tokens, int64_t heads,
                  int64_t head_dim, int64_t rotary_dim, float mscale) {
  rope_apply<T, 1>(x, y, positions, inv_freq, tokens, heads, head_dim, rotary_dim, mscale);
}

template <class T>
void rope_backward(const T* dy, T* dx, const int32_t* positions, const float* inv_freq, int64_t tokens,
                   int64_t heads, int64_t head_dim, int64_t rotary_dim, float mscale) {
  rope_apply<T, -1>(dy, dx, positions, inv_freq, tokens, heads, head_dim, rotary_dim, mscale);
}

#define LOOM_INST(T)                                                                                     \
  template void rope_forward<T>(const T*, T*, const int32_t*, const float*, int64_t, int64_t, int64_t, int64_t, float); \
  template void rope_backward<T>(const T*, T*, const int32_t*, const float*, int64_t, int64_t, int64_t, int64_t, float);
LOOM_INST(float)
LOOM_INST(double)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cpu
