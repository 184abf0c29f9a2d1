// CUDA kernels for kernels/cross_entropy.h: one block per row; the forward streams the row once
// with an online (max, sum of exp) pair per thread, merged across the block; the backward
// recomputes softmax from the saved lse. Targets outside [0, vocab) are treated as ignored.
#include "kernels/cross_entropy.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/softmax_common.cuh"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

using softmax::capped;
using softmax::counts;
using softmax::merge;
using softmax::online_add;

// Grid n blocks of kThreads. lse[i] for every row; loss[i] = lse[i] - z[i, t] or 0.
template <class T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_forward_kernel(const T* logits, const int32_t* targets, float* loss, float* lse, int64_t vocab,
                                 float softcap, int32_t ignore_index) {
  const int64_t i = blockIdx.x;
  const T* row = logits + i * vocab;
  float m = -INFINITY, l = 0.f;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) {
    online_add(m, l, capped(load(row + v), softcap));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
    merge(m, l, m2, l2);
  }
  __shared__ float warp_m[kThreads / 32], warp_l[kThreads / 32];
  if ((threadIdx.x & 31) == 0) {
    warp_m[threadIdx.x >> 5] = m;
    warp_l[threadIdx.x >> 5] = l;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  m = warp_m[0];
  l = warp_l[0];
  for (int w = 1; w < kThreads / 32; ++w) merge(m, l, warp_m[w], warp_l[w]);
  const float row_lse = l == 0.f ? m : m + logf(l);  // a NaN l (a NaN logit) stays NaN
  lse[i] = row_lse;
  const int32_t t = targets[i];
  loss[i] = counts(t, vocab, ignore_index) ? row_lse - capped(load(row + t), softcap) : 0.f;
}

// Grid n blocks of kThreads: dlogits[i, v] = dloss[i] * (exp(z - lse[i]) - [v == t]) * dz/dx.
template <class T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward_kernel(const T* logits, const int32_t* targets, const float* lse, const float* dloss,
                                  T* dlogits, int64_t vocab, float softcap, int32_t ignore_index) {
  const int64_t i = blockIdx.x;
  const T* row = logits + i * vocab;
  T* grad = dlogits + i * vocab;
  const int32_t t = targets[i];
  if (!counts(t, vocab, ignore_index)) {
    for (int64_t v = threadIdx.x; v < vocab; v += kThreads) store(grad + v, 0.f);
    return;
  }
  const float row_lse = lse[i], g = dloss[i];
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) {
    const float x = load(row + v);
    float z = x, dz = 1.f;
    if (softcap > 0.f) {
      const float th = tanhf(x / softcap);
      z = softcap * th;
      dz = 1.f - th * th;
    }
    store(grad + v, g * (expf(z - row_lse) - (v == t ? 1.f : 0.f)) * dz);
  }
}

void check_shape(int64_t n, int64_t vocab, float softcap, const char* op) {
  LOOM_CHECK(n >= 0 && n <= 0x7fffffffLL && vocab > 0, op, ": bad shape n=", n, " vocab=", vocab);
  LOOM_CHECK(softcap >= 0.f, op, ": softcap must be >= 0 (0 = off), got ", softcap);
}

}  // namespace

template <class T>
void cross_entropy_forward(const T* logits, const int32_t* targets, float* loss, float* lse, int64_t n,
                           int64_t vocab, float softcap, int32_t ignore_index, Stream s) {
  check_shape(n, vocab, softcap, "cuda::cross_entropy_forward");
  if (n == 0) return;
  cross_entropy_forward_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(logits, targets, loss, lse, vocab,
                                                                             softcap, ignore_index);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <class T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const float* lse, const float* dloss,
                            T* dlogits, int64_t n, int64_t vocab, float softcap, int32_t ignore_index, Stream s) {
  check_shape(n, vocab, softcap, "cuda::cross_entropy_backward");
  if (n == 0) return;
  cross_entropy_backward_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(logits, targets, lse, dloss, dlogits,
                                                                              vocab, softcap, ignore_index);
  LOOM_CUDA_LAUNCH_CHECK();
}

#define LOOM_INST(T)                                                                                         \
  template void cross_entropy_forward<T>(const T*, const int32_t*, float*, float*, int64_t, int64_t, float,  \
                                         int32_t, Stream);                                                   \
  template void cross_entropy_backward<T>(const T*, const int32_t*, const float*, const float*, T*, int64_t,  \
                                          int64_t, float, int32_t, Stream);
LOOM_INST(float)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cuda
