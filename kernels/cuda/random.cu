// CUDA counter-based fills (kernels/philox.h): one thread per Philox block of four outputs, written
// as one vector store (16 bytes f32, 8 bytes bf16) when the output is aligned, the same host/device
// functions as the CPU reference, so uniform_fill is bit-identical to it.
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/philox.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

// Elements 4j .. 4j+3 of out (those < n): one 4-lane vector store when kVec and the block is
// whole (out is then aligned to 4 * sizeof(T) bytes), else lane by lane.
template <bool kVec, class T>
__device__ __forceinline__ void store_block(T* out, int64_t n, int64_t j, const float (&v)[4]) {
  if (kVec && 4 * j + 3 < n) {
    store_vec<4>(out + 4 * j, v);
  } else {
    for (int lane = 0; lane < 4 && 4 * j + lane < n; ++lane) store(out + 4 * j + lane, v[lane]);
  }
}

template <bool kVec, class T>
__global__ void uniform_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi) {
  const int64_t blocks = (n + 3) / 4;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < blocks; j += int64_t(gridDim.x) * blockDim.x) {
    const Philox4 x = philox_block(seed, offset + static_cast<uint64_t>(j));
    float v[4];
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) v[lane] = philox_uniform(x.v[lane], lo, hi);
    store_block<kVec>(out, n, j, v);
  }
}

template <bool kVec, class T>
__global__ void normal_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, float mean, float std) {
  const int64_t blocks = (n + 3) / 4;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < blocks; j += int64_t(gridDim.x) * blockDim.x) {
    const Philox4 x = philox_block(seed, offset + static_cast<uint64_t>(j));
    float v[4];
    philox_normal_pair(x, 0, mean, std, v);
    philox_normal_pair(x, 1, mean, std, v + 2);
    store_block<kVec>(out, n, j, v);
  }
}

// May a whole block of 4 elements be stored as one access?
template <class T>
bool aligned_block(const T* p) { return (reinterpret_cast<uintptr_t>(p) & (4 * sizeof(T) - 1)) == 0; }

}  // namespace

template <class T>
void uniform_fill(T* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi, Stream s) {
  LOOM_CHECK(n >= 0, "cuda uniform_fill: n = ", n);
  if (n == 0) return;
  LOOM_CHECK(out != nullptr, "cuda uniform_fill: null output");
  const unsigned grid = blocks_for((n + 3) / 4, kThreads);
  if (aligned_block(out))
    uniform_kernel<true><<<grid, kThreads, 0, s>>>(out, n, seed, offset, lo, hi);
  else
    uniform_kernel<false><<<grid, kThreads, 0, s>>>(out, n, seed, offset, lo, hi);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <class T>
void normal_fill(T* out, int64_t n, uint64_t seed, uint64_t offset, float mean, float std, Stream s) {
  LOOM_CHECK(n >= 0, "cuda normal_fill: n = ", n);
  if (n == 0) return;
  LOOM_CHECK(out != nullptr, "cuda normal_fill: null output");
  const unsigned grid = blocks_for((n + 3) / 4, kThreads);
  if (aligned_block(out))
    normal_kernel<true><<<grid, kThreads, 0, s>>>(out, n, seed, offset, mean, std);
  else
    normal_kernel<false><<<grid, kThreads, 0, s>>>(out, n, seed, offset, mean, std);
  LOOM_CUDA_LAUNCH_CHECK();
}

template void uniform_fill<float>(float*, int64_t, uint64_t, uint64_t, float, float, Stream);
template void uniform_fill<bf16>(bf16*, int64_t, uint64_t, uint64_t, float, float, Stream);
template void normal_fill<float>(float*, int64_t, uint64_t, uint64_t, float, float, Stream);
template void normal_fill<bf16>(bf16*, int64_t, uint64_t, uint64_t, float, float, Stream);

}  // namespace loom::cuda
