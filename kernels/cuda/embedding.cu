// CUDA kernels for kernels/embedding.h: a block per token row copies (16-byte packs when aligned)
// or scatter-adds with f32 atomics; rows narrower than a warp (a MoE layer's routing weight per row)
// take a thread per element instead. Ids outside [0, vocab) never touch memory outside the table.
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/embedding.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535LL * 32;

// out[i, :] = table[ids[i], :] or zeros for a bad id; rows in a grid-stride loop, N elements
// (one Vec) per access. Requires dim % N == 0.
template <class T, int N>
__global__ void embedding_forward_kernel(const int32_t* ids, const T* table, T* out, int64_t n, int64_t vocab,
                                         int64_t dim) {
  using V = Vec<T, N>;
  const int64_t groups = dim / N;
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int32_t id = ids[i];
    V* dst = reinterpret_cast<V*>(out + i * dim);
    if (id >= 0 && id < vocab) {
      const V* src = reinterpret_cast<const V*>(table + int64_t(id) * dim);
      for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) dst[g] = src[g];
    } else {
      const V zero{};  // all-zero bits: +0 for f32 and bf16
      for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) dst[g] = zero;
    }
  }
}

// dtable[ids[i], :] += dout[i, :], skipping bad ids. Atomics make repeated ids safe; the f32
// summation order of repeated ids is not fixed.
template <class T>
__global__ void embedding_backward_kernel(const int32_t* ids, const T* dout, float* dtable, int64_t n, int64_t vocab,
                                          int64_t dim) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab) continue;  // uniform across the block
    float* dst = dtable + int64_t(id) * dim;
    const T* src = dout + i * dim;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) atomicAdd(dst + c, load(src + c));
  }
}

// Rows of fewer than kSmallDim elements: a thread per element in a grid-stride loop (a block per
// row would leave all but `dim` of its threads idle). Same results as the kernels above.
constexpr int64_t kSmallDim = 32;

template <class T>
__global__ void embedding_forward_small_kernel(const int32_t* ids, const T* table, T* out, int64_t n, int64_t vocab,
                                               int64_t dim) {
  const int64_t total = n * dim, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t i = e / dim, c = e - i * dim;
    const int32_t id = ids[i];
    out[e] = id >= 0 && id < vocab ? table[int64_t(id) * dim + c] : T{};  // T{}: +0 for f32 and bf16
  }
}

template <class T>
__global__ void embedding_backward_small_kernel(const int32_t* ids, const T* dout, float* dtable, int64_t n,
                                                int64_t vocab, int64_t dim) {
  const int64_t total = n * dim, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t i = e / dim, c = e - i * dim;
    const int32_t id = ids[i];
    if (id >= 0 && id < vocab) atomicAdd(dtable + int64_t(id) * dim + c, load(dout + e));
  }
}

unsigned small_blocks(int64_t elements) {
  const int64_t b = (elements + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

}  // namespace

template <class T>
void embedding_forward(const int32_t* ids, const T* table, T* out, int64_t n, int64_t vocab, int64_t dim, Stream s) {
  LOOM_CHECK(n >= 0 && vocab > 0 && dim > 0, "embedding_forward: bad shape n=", n, " vocab=", vocab, " dim=", dim);
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(n < kMaxBlocks ? n : kMaxBlocks);
  constexpr int kN = kVecN<T>;
  if (dim < kSmallDim)
    embedding_forward_small_kernel<T><<<small_blocks(n * dim), kThreads, 0, s>>>(ids, table, out, n, vocab, dim);
  else if (dim % kN == 0 && aligned16(table) && aligned16(out))
    embedding_forward_kernel<T, kN><<<blocks, kThreads, 0, s>>>(ids, table, out, n, vocab, dim);
  else
    embedding_forward_kernel<T, 1><<<blocks, kThreads, 0, s>>>(ids, table, out, n, vocab, dim);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <class T>
void embedding_backward(const int32_t* ids, const T* dout, float* dtable, int64_t n, int64_t vocab, int64_t dim,
                        Stream s) {
  LOOM_CHECK(n >= 0 && vocab > 0 && dim > 0, "embedding_backward: bad shape n=", n, " vocab=", vocab, " dim=", dim);
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(n < kMaxBlocks ? n : kMaxBlocks);
  if (dim < kSmallDim)
    embedding_backward_small_kernel<T><<<small_blocks(n * dim), kThreads, 0, s>>>(ids, dout, dtable, n, vocab, dim);
  else
    embedding_backward_kernel<T><<<blocks, kThreads, 0, s>>>(ids, dout, dtable, n, vocab, dim);
  LOOM_CUDA_LAUNCH_CHECK();
}

#define LOOM_INST(T)                                                                                      \
  template void embedding_forward<T>(const int32_t*, const T*, T*, int64_t, int64_t, int64_t, Stream);   \
  template void embedding_backward<T>(const int32_t*, const T*, float*, int64_t, int64_t, int64_t, Stream);
LOOM_INST(float)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cuda
