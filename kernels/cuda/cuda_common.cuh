// CUDA-only helpers for kernels/cuda/*.cu: the check macros, launch-error check, fast bf16
// conversions through cuda_bf16.h, and warp reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/common.h"

#define LOOM_CUDA_CHECK(expr)                                                                  \
  do {                                                                                         \
    cudaError_t loom_err_ = (expr);                                                            \
    if (loom_err_ != cudaSuccess)                                                              \
      ::loom::detail::fail(__FILE__, __LINE__,                                                 \
                           ::loom::detail::cat("CUDA error ", cudaGetErrorString(loom_err_),   \
                                               " in ", #expr));                                \
  } while (0)

// Ends every launcher: reports a bad launch configuration at the launch site.
#define LOOM_CUDA_LAUNCH_CHECK() LOOM_CUDA_CHECK(cudaGetLastError())

namespace loom::cuda {

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const bf16* p) {
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
}
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) {
  *reinterpret_cast<__nv_bfloat16*>(p) = __float2bfloat16_rn(v);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < nwarps ? partial[lane] : 0.f;
  return warp_sum(v);
}

inline unsigned blocks_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535LL * 32 ? 65535LL * 32 : b));
}

}  // namespace loom::cuda
