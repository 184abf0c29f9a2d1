// CUDA-only helpers for kernels/cuda/*.cu: the check macros, launch-error check, fast bf16
// conversions through cuda_bf16.h, 16-byte vector loads/stores, warp reductions, grid sizing.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/common.h"
#include "kernels/cuda_check.h"


// Ends every launcher: reports a bad launch configuration at the launch site.
#define LOOM_CUDA_LAUNCH_CHECK() LOOM_CUDA_CHECK(cudaGetLastError())

namespace loom::cuda {

// Lets kKernel launch with `bytes` of dynamic shared memory (over the default 48 KB) on the
// current device. The allowance belongs to the kernel's instance on one device, so it is set once
// for each device the process launches on (a --device-map over several GPUs runs the same kernels
// on each), not once per process.
template <auto kKernel>
void allow_dynamic_smem(size_t bytes) {
  static std::atomic<uint64_t> devices{0};  // bit d: set on device d (devices past 63 set it every time)
  int dev = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
  if (bit != 0 && (devices.load(std::memory_order_acquire) & bit) != 0) return;
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  devices.fetch_or(bit, std::memory_order_release);
}

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const bf16* p) {
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
}
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) {
  *reinterpret_cast<__nv_bfloat16*>(p) = __float2bfloat16_rn(v);
}

// N consecutive elements moved as one access: 16 bytes (LDG.128 / STG.128) when
// N = kVecN<T> = 16 / sizeof(T), smaller when N is smaller. The address must be aligned to
// sizeof(T) * N.
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  static_assert(sizeof(T) * N <= 16 && (N & (N - 1)) == 0, "a Vec is at most 16 bytes, N a power of two");
  T v[N];
};
template <class T>
inline constexpr int kVecN = static_cast<int>(16 / sizeof(T));

// N elements of T at p, converted to f32; N * sizeof(T) over 16 bytes is split into 16-byte
// accesses, so p needs alignment min(16, N * sizeof(T)) bytes.
template <int N, class T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[N]) {
  constexpr int kChunk = N < kVecN<T> ? N : kVecN<T>;
#pragma unroll
  for (int c = 0; c < N; c += kChunk) {
    const Vec<T, kChunk> v = *reinterpret_cast<const Vec<T, kChunk>*>(p + c);
#pragma unroll
    for (int k = 0; k < kChunk; ++k) out[c + k] = load(&v.v[k]);
  }
}
template <int N, class T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[N]) {
  constexpr int kChunk = N < kVecN<T> ? N : kVecN<T>;
#pragma unroll
  for (int c = 0; c < N; c += kChunk) {
    Vec<T, kChunk> v;
#pragma unroll
    for (int k = 0; k < kChunk; ++k) store(&v.v[k], in[c + k]);
    *reinterpret_cast<Vec<T, kChunk>*>(p + c) = v;
  }
}

// Host side: may a kernel use 16-byte accesses at p?
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// max(a, b) that is NaN when either is (fmaxf returns the other one, which would let a NaN score
// vanish from a softmax): one max.NaN instruction on sm_80+, as cheap as fmaxf.
__device__ __forceinline__ float nan_fmaxf(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? a + b : fmaxf(a, b);
#endif
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

// Streaming multiprocessors of the current device, queried once per device and cached.
inline int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];  // 0: not queried yet; racing writers store the same value
  int dev = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cacheable = dev >= 0 && dev < kMaxDevices;
  int sms = cacheable ? cached[dev].load(std::memory_order_relaxed) : 0;
  if (sms == 0) {
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (sms < 1) sms = 1;
    if (cacheable) cached[dev].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

// Grid for a grid-stride loop over n work items: enough blocks to cover n, at most
// blocks_per_sm per SM. Give the kernel __launch_bounds__(threads, blocks_per_sm) so that many
// are resident at once: the whole grid is then one wave, with no partial second wave.
inline unsigned grid_for(int64_t n, int threads, int blocks_per_sm) {
  const int64_t cover = (n + threads - 1) / threads;
  const int64_t cap = int64_t(sm_count()) * blocks_per_sm;
  return static_cast<unsigned>(cover < 1 ? 1 : (cover < cap ? cover : cap));
}

}  // namespace loom::cuda
