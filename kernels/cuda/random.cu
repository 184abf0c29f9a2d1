// CUDA counter-based fills (kernels/philox.h): one thread per Philox block of four outputs, the
// same host/device functions as the CPU reference, so uniform_fill is bit-identical to it.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/philox.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__device__ __forceinline__ void store_block(T* out, int64_t n, int64_t j, const float* v) {
  for (int lane = 0; lane < 4 && 4 * j + lane < n; ++lane) store(out + 4 * j + lane, v[lane]);
}

template <class T>
__global__ void uniform_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi) {
  const int64_t blocks = (n + 3) / 4;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < blocks; j += int64_t(gridDim.x) * blockDim.x) {
    const Philox4 x = philox_block(seed, offset + static_cast<uint64_t>(j));
    float v[4];
    for (int lane = 0; lane < 4; ++lane) v[lane] = philox_uniform(x.v[lane], lo, hi);
    store_block(out, n, j, v);
  }
}

template <class T>
__global__ void normal_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, float mean, float std) {
  const int64_t blocks = (n + 3) / 4;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < blocks; j += int64_t(gridDim.x) * blockDim.x) {
    const Philox4 x = philox_block(seed, offset + static_cast<uint64_t>(j));
    float v[4];
    philox_normal_pair(x, 0, mean, std, v);
    philox_normal_pair(x, 1, mean, std, v + 2);
    store_block(out, n, j, v);
  }
}

}  // namespace

template <class T>
void uniform_fill(T* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi, Stream s) {
  LOOM_CHECK(n >= 0, "cuda uniform_fill: n = ", n);
  if (n == 0) return;
  LOOM_CHECK(out != nullptr, "cuda uniform_fill: null output");
  uniform_kernel<T><<<blocks_for((n + 3) / 4, kThreads), kThreads, 0, s>>>(out, n, seed, offset, lo, hi);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <class T>
void normal_fill(T* out, int64_t n, uint64_t seed, uint64_t offset, float mean, float std, Stream s) {
  LOOM_CHECK(n >= 0, "cuda normal_fill: n = ", n);
  if (n == 0) return;
  LOOM_CHECK(out != nullptr, "cuda normal_fill: null output");
  normal_kernel<T><<<blocks_for((n + 3) / 4, kThreads), kThreads, 0, s>>>(out, n, seed, offset, mean, std);
  LOOM_CUDA_LAUNCH_CHECK();
}

template void uniform_fill<float>(float*, int64_t, uint64_t, uint64_t, float, float, Stream);
template void uniform_fill<bf16>(bf16*, int64_t, uint64_t, uint64_t, float, float, Stream);
template void normal_fill<float>(float*, int64_t, uint64_t, uint64_t, float, float, Stream);
template void normal_fill<bf16>(bf16*, int64_t, uint64_t, uint64_t, float, float, Stream);

}  // namespace loom::cuda
