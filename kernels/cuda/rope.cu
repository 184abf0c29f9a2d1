// CUDA kernels for kernels/rope.h. Each angle's cos/sin is computed once per token and applied in
// every head. Two kernels: rope_vec_kernel (whole-head rotation with 16-byte aligned rows: one thread
// per token and 16 bytes of frequencies, 16-byte accesses, heads taken kHeadBatch at a time with all
// their loads issued before any store) and rope_kernel (anything else: partial rotary, odd widths,
// unaligned pointers; one thread per (token, frequency), one element at a time).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/rope_angles.cuh"
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
    float cv[1], sv[1];
    rope_angles<kSign, 1>(pos, inv_freq + i, mscale, cv, sv);
    const float c = cv[0], sn = sv[0];
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

// Rotates heads [0, heads) of one tensor for token t, frequencies [j * V, j * V + V): sine and
// cosine given. Loads of kHeadBatch heads go out before their stores, so that a thread keeps that
// many 32-byte reads in flight (in == out stays safe: a thread writes only the elements it read).
template <int kSign, int V, class T>
__device__ __forceinline__ void rotate_heads(const T* in, T* out, int64_t t, int64_t heads, int64_t half,
                                             int64_t head_dim, int64_t j, const float (&c)[V], const float (&sn)[V]) {
  constexpr int kHeadBatch = 4;
  for (int64_t h0 = 0; h0 < heads; h0 += kHeadBatch) {
    float x1[kHeadBatch][V], x2[kHeadBatch][V];
#pragma unroll
    for (int b = 0; b < kHeadBatch; ++b) {
      if (h0 + b >= heads) break;
      const int64_t base = (t * heads + h0 + b) * head_dim + j * V;
      load_vec<V>(in + base, x1[b]);
      load_vec<V>(in + base + half, x2[b]);
    }
#pragma unroll
    for (int b = 0; b < kHeadBatch; ++b) {
      if (h0 + b >= heads) break;
      const int64_t base = (t * heads + h0 + b) * head_dim + j * V;
      float y1[V], y2[V];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        y1[k] = x1[b][k] * c[k] - x2[b][k] * sn[k];
        y2[k] = x2[b][k] * c[k] + x1[b][k] * sn[k];
      }
      store_vec<V>(out + base, y1);
      store_vec<V>(out + base + half, y2);
    }
  }
}

// Whole-head rotation (rotary_dim == head_dim), half a multiple of V = 16 / sizeof(T), every pointer
// 16-byte aligned: thread (t, j) with j < half / V, the same arithmetic as rope_kernel element by element.
template <class T, int kSign>
__global__ void rope_vec_kernel(const T* in, T* out, const int32_t* positions, const float* inv_freq, int64_t tokens,
                                int64_t heads, int64_t half, float mscale, const T* in2, T* out2, int64_t heads2) {
  constexpr int V = kVecN<T>;
  const int64_t groups = half / V;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t t = idx / groups, j = idx % groups;
  if (t >= tokens) return;
  const float pos = static_cast<float>(positions[t]);
  float c[V], sn[V];
  rope_angles<kSign, V>(pos, inv_freq + j * V, mscale, c, sn);
  rotate_heads<kSign, V>(in, out, t, heads, half, 2 * half, j, c, sn);
  if (heads2 > 0) rotate_heads<kSign, V>(in2, out2, t, heads2, half, 2 * half, j, c, sn);
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
  constexpr int V = kVecN<T>;
  const bool whole = rotary_dim == head_dim && half % V == 0 && aligned16(in) && aligned16(out) &&
                     (heads2 == 0 || (aligned16(in2) && aligned16(out2)));
  if (whole) {
    // bench/results/session42: Llama 1B's q and k (16384 tokens, 32 + 8 heads of 64) took 105 us a
    // call in rope_kernel on the H100 (1.6 TB/s), a thread's head loop waiting on each load in turn.
    const int64_t threads = tokens * (half / V), block = 256;
    LOOM_CHECK((threads + block - 1) / block <= INT32_MAX, "rope: too many tokens (", tokens, ")");
    rope_vec_kernel<T, kSign><<<static_cast<unsigned>((threads + block - 1) / block), block, 0, s>>>(
        in, out, positions, inv_freq, tokens, heads, half, mscale, in2, out2, heads2);
    LOOM_CUDA_LAUNCH_CHECK();
    return;
  }
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
