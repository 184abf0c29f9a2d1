// CUDA kernels for kernels/rope.h: one thread per (token, frequency) computes cos/sin once and
// rotates that pair in every head; threads along x walk the frequencies, so accesses coalesce.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/rope.h"

namespace loom::cuda {
namespace {

// kSign = +1 forward, -1 the transpose (backward). in == out is allowed: each thread reads both
// elements of a pair before writing them, and no other thread touches that pair.
template <class T, int kSign>
__global__ void rope_kernel(const T* in, T* out, const int32_t* positions, const float* inv_freq, int64_t tokens,
                            int64_t heads, int64_t half, int64_t head_dim, float mscale, const T* in2, T* out2,
                            int64_t heads2) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (t >= tokens) return;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    // One f32 product as in Hugging Face; sincosf (not __sinf) keeps full range reduction for
    // angles up to ~1e6 rad.
    float sn, c;
    sincosf(pos * inv_freq[i], &sn, &c);
    c *= mscale;  // LongRoPE's attention scaling (else 1: exact)
    sn *= mscale * static_cast<float>(kSign);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (t * heads + h) * head_dim;
      const float x1 = load(in + base + i), x2 = load(in + base + i + half);
      store(out + base + i, x1 * c - x2 * sn);
      store(out + base + i + half, x2 * c + x1 * sn);
    }
    for (int64_t h = 0; h < heads2; ++h) {  // the second tensor (k beside q): the same angles
      const int64_t base = (t * heads2 + h) * head_dim;
      const float x1 = load(in2 + base + i), x2 = load(in2 + base + i + half);
      store(out2 + base + i, x1 * c - x2 * sn);
      store(out2 + base + i + half, x2 * c + x1 * sn);
    }
  }
  if (in == out || 2 * half == head_dim) return;
  // Partial rotary: the rest of every head passes through (out of place only).
  for (int64_t j = 2 * half + threadIdx.x; j < head_dim; j += blockDim.x) {
    for (int64_t h = 0; h < heads; ++h) out[(t * heads + h) * head_dim + j] = in[(t * heads + h) * head_dim + j];
    for (int64_t h = 0; h < heads2; ++h) out2[(t * heads2 + h) * head_dim + j] = in2[(t * heads2 + h) * head_dim + j];
  }
}

template <class T, int kSign>
void launch(const T* in, T* out, const int32_t* positions, const float* inv_freq, int64_t tokens, int64_t heads,
            int64_t head_dim, int64_t rotary_dim, float mscale, Stream s, const T* in2 = nullptr, T* out2 = nullptr,
            int64_t heads2 = 0) {
  LOOM_CHECK(tokens >= 0 && heads > 0 && head_dim > 0 && head_dim % 2 == 0, "rope: bad shape [", tokens, ", ",
             heads, ", ", head_dim, "] (head_dim must be even)");
  LOOM_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim, "rope: rotary_dim ", rotary_dim,
             " must be even, positive and at most head_dim ", head_dim);
  if (tokens == 0) return;
  const int64_t half = rotary_dim / 2;
  // x: frequencies (a multiple of 32, at most 128); y: tokens, 256 threads in all.
  const int bx = static_cast<int>(half >= 128 ? 128 : (half + 31) / 32 * 32);
  const int by = 256 / bx;
  const int64_t blocks = (tokens + by - 1) / by;
  LOOM_CHECK(blocks <= INT32_MAX, "rope: too many tokens (", tokens, ")");
  rope_kernel<T, kSign><<<static_cast<unsigned>(blocks), dim3(bx, by), 0, s>>>(in, out, positions, inv_freq, tokens,
                                                                               heads, half, head_dim, mscale, in2, out2,
                                                                               heads2);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <class T>
void rope_forward(const T* x, T* y, const int32_t* positions, const float* inv_freq, int64_t tokens, int64_t heads,
                  int64_t head_dim, int64_t rotary_dim, float mscale, Stream s) {
  launch<T, 1>(x, y, positions, inv_freq, tokens, heads, head_dim, rotary_dim, mscale, s);
}

template <class T>
void rope_backward(const T* dy, T* dx, const int32_t* positions, const float* inv_freq, int64_t tokens,
                   int64_t heads, int64_t head_dim, int64_t rotary_dim, float mscale, Stream s) {
  launch<T, -1>(dy, dx, positions, inv_freq, tokens, heads, head_dim, rotary_dim, mscale, s);
}

template <class T>
void rope_pair(const T* q, T* q_out, int64_t q_heads, const T* k, T* k_out, int64_t k_heads, const int32_t* positions,
               const float* inv_freq, int64_t tokens, int64_t head_dim, int64_t rotary_dim, float mscale, bool backward,
               Stream s) {
  LOOM_CHECK(k_heads >= 0 && (k_heads == 0 || (k && k_out)), "rope_pair: bad second tensor (", k_heads, " heads)");
  if (backward)
    launch<T, -1>(q, q_out, positions, inv_freq, tokens, q_heads, head_dim, rotary_dim, mscale, s, k, k_out, k_heads);
  else
    launch<T, 1>(q, q_out, positions, inv_freq, tokens, q_heads, head_dim, rotary_dim, mscale, s, k, k_out, k_heads);
}

#define LOOM_INST(T)                                                                                            \
  template void rope_forward<T>(const T*, T*, const int32_t*, const float*, int64_t, int64_t, int64_t, int64_t, float, \
                                Stream);                                                                             \
  template void rope_backward<T>(const T*, T*, const int32_t*, const float*, int64_t, int64_t, int64_t, int64_t, float, \
                                 Stream);                                                                             \
  template void rope_pair<T>(const T*, T*, int64_t, const T*, T*, int64_t, const int32_t*, const float*, int64_t,  \
                             int64_t, int64_t, float, bool, Stream);
LOOM_INST(float)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cuda
