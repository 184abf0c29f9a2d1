// CUDA kernel for kernels/dropout.h: one thread per element, mask regenerated from Philox.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/dropout.h"

namespace loom::cuda {
namespace {

template <class T>
__global__ void dropout_kernel(const T* x, T* out, int64_t n, float p, float scale, uint64_t seed, uint64_t offset) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(out + i, dropout_keep(seed, offset, i, p) ? load(x + i) * scale : 0.f);
}

}  // namespace

template <class T>
void dropout(const T* x, T* out, int64_t n, float p, uint64_t seed, uint64_t offset, Stream s) {
  LOOM_CHECK(p >= 0.f && p < 1.f, "dropout: p must be in [0, 1), got ", p);
  if (n == 0) return;
  dropout_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x, out, n, p, 1.f / (1.f - p), seed, offset);
  LOOM_CUDA_LAUNCH_CHECK();
}

template void dropout<float>(const float*, float*, int64_t, float, uint64_t, uint64_t, Stream);
template void dropout<bf16>(const bf16*, bf16*, int64_t, float, uint64_t, uint64_t, Stream);

}  // namespace loom::cuda
