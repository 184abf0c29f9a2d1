// CUDA kernels for kernels/elementwise.h: grid-stride elementwise loops, a strided gather with
// cast, column sums, and deterministic two-pass reductions.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/elementwise.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void axpby_kernel(const T* a, const T* b, T* out, int64_t n, float alpha, float beta) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(out + i, alpha * load(a + i) + beta * load(b + i));
}

template <class T>
__global__ void mul_kernel(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(out + i, load(a + i) * load(b + i));
}

template <class T>
__global__ void scale_kernel(const T* a, T* out, int64_t n, float s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(out + i, s * load(a + i));
}

template <class T>
__global__ void add_bias_kernel(const T* a, const T* bias, T* out, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(out + i, load(a + i) + load(bias + i % cols));
}

// One thread per column, rows walked in order: deterministic, coalesced across the warp.
template <class T, class O>
__global__ void sum_rows_kernel(const T* a, O* out, int64_t rows, int64_t cols, bool accumulate) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float acc = accumulate ? load(out + c) : 0.f;
  for (int64_t r = 0; r < rows; ++r) acc += load(a + r * cols + c);
  store(out + c, acc);
}

template <class T>
__global__ void fill_kernel(T* out, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(out + i, v);
}

template <class T>
__global__ void softcap_forward_kernel(const T* a, T* out, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(out + i, cap * tanhf(load(a + i) / cap));
}

template <class T>
__global__ void softcap_backward_kernel(const T* a, const T* dout, T* da, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float t = tanhf(load(a + i) / cap);
    store(da + i, load(dout + i) * (1.f - t * t));
  }
}

__device__ __forceinline__ int64_t strided_offset(int64_t i, const StridedLayout& l) {
  int64_t off = 0;
  for (int d = l.ndim - 1; d >= 0; --d) {
    off += (i % l.shape[d]) * l.strides[d];
    i /= l.shape[d];
  }
  return off;
}

template <class S, class D>
__global__ void copy_strided_kernel(const S* src, StridedLayout l, D* dst, int64_t numel) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x)
    store(dst + i, load(src + strided_offset(i, l)));
}

template <class E>
__global__ void copy_bytes_kernel(const E* src, StridedLayout l, E* dst, int64_t numel) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = src[strided_offset(i, l)];
}

// Pass 1: each block reduces a grid-stride slice into partial[blockIdx.x]. Pass 2: one block sums
// the partials in a fixed order. Same input, same bits, every run.
template <class T, bool kSquare>
__global__ void reduce_partial_kernel(const T* a, int64_t n, float* partial) {
  float acc = 0.f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = load(a + i);
    acc += kSquare ? v * v : v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void reduce_final_kernel(const float* partial, int count, float* out) {
  float acc = 0.f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc;
}

template <class T, bool kSquare>
void reduce(const T* a, int64_t n, float* out, float* workspace, Stream s) {
  LOOM_CHECK(workspace != nullptr, "cuda reduction needs a workspace of ", kReduceWorkspaceFloats, " floats");
  int blocks = static_cast<int>((n + kThreads - 1) / kThreads);
  blocks = blocks < 1 ? 1 : (blocks > kReduceWorkspaceFloats ? kReduceWorkspaceFloats : blocks);
  reduce_partial_kernel<T, kSquare><<<blocks, kThreads, 0, s>>>(a, n, workspace);
  LOOM_CUDA_LAUNCH_CHECK();
  reduce_final_kernel<<<1, 1024, 0, s>>>(workspace, blocks, out);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <class T>
void axpby(const T* a, const T* b, T* out, int64_t n, float alpha, float beta, Stream s) {
  if (n == 0) return;
  axpby_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(a, b, out, n, alpha, beta);
  LOOM_CUDA_LAUNCH_CHECK();
}
template <class T>
void mul(const T* a, const T* b, T* out, int64_t n, Stream s) {
  if (n == 0) return;
  mul_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(a, b, out, n);
  LOOM_CUDA_LAUNCH_CHECK();
}
template <class T>
void scale(const T* a, T* out, int64_t n, float sc, Stream s) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(a, out, n, sc);
  LOOM_CUDA_LAUNCH_CHECK();
}
template <class T>
void add_bias(const T* a, const T* bias, T* out, int64_t rows, int64_t cols, Stream s) {
  if (rows * cols == 0) return;
  add_bias_kernel<<<blocks_for(rows * cols, kThreads), kThreads, 0, s>>>(a, bias, out, rows, cols);
  LOOM_CUDA_LAUNCH_CHECK();
}
template <class T, class O>
void sum_rows(const T* a, O* out, int64_t rows, int64_t cols, bool accumulate, Stream s) {
  if (cols == 0) return;
  sum_rows_kernel<<<blocks_for(cols, kThreads), kThreads, 0, s>>>(a, out, rows, cols, accumulate);
  LOOM_CUDA_LAUNCH_CHECK();
}
template <class T>
void fill(T* out, int64_t n, float value, Stream s) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(out, n, value);
  LOOM_CUDA_LAUNCH_CHECK();
}
template <class T>
void softcap_forward(const T* a, T* out, int64_t n, float cap, Stream s) {
  LOOM_CHECK(cap > 0.f, "softcap_forward: cap must be positive, got ", cap);
  if (n == 0) return;
  softcap_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(a, out, n, cap);
  LOOM_CUDA_LAUNCH_CHECK();
}
template <class T>
void softcap_backward(const T* a, const T* dout, T* da, int64_t n, float cap, Stream s) {
  LOOM_CHECK(cap > 0.f, "softcap_backward: cap must be positive, got ", cap);
  if (n == 0) return;
  softcap_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(a, dout, da, n, cap);
  LOOM_CUDA_LAUNCH_CHECK();
}
template <class S, class D>
void copy_strided(const S* src, const StridedLayout& l, D* dst, Stream s) {
  int64_t numel = 1;
  for (int d = 0; d < l.ndim; ++d) numel *= l.shape[d];
  if (numel == 0) return;
  copy_strided_kernel<<<blocks_for(numel, kThreads), kThreads, 0, s>>>(src, l, dst, numel);
  LOOM_CUDA_LAUNCH_CHECK();
}
void copy_strided_bytes(const void* src, const StridedLayout& l, void* dst, int elem_size, Stream s) {
  int64_t numel = 1;
  for (int d = 0; d < l.ndim; ++d) numel *= l.shape[d];
  if (numel == 0) return;
  const unsigned blocks = blocks_for(numel, kThreads);
  switch (elem_size) {
    case 1: copy_bytes_kernel<<<blocks, kThreads, 0, s>>>(static_cast<const uint8_t*>(src), l, static_cast<uint8_t*>(dst), numel); break;
    case 2: copy_bytes_kernel<<<blocks, kThreads, 0, s>>>(static_cast<const uint16_t*>(src), l, static_cast<uint16_t*>(dst), numel); break;
    case 4: copy_bytes_kernel<<<blocks, kThreads, 0, s>>>(static_cast<const uint32_t*>(src), l, static_cast<uint32_t*>(dst), numel); break;
    case 8: copy_bytes_kernel<<<blocks, kThreads, 0, s>>>(static_cast<const uint64_t*>(src), l, static_cast<uint64_t*>(dst), numel); break;
    default: LOOM_CHECK(false, "copy_strided_bytes: unsupported element size ", elem_size);
  }
  LOOM_CUDA_LAUNCH_CHECK();
}
template <class T>
void sum(const T* a, int64_t n, float* out, float* workspace, Stream s) { reduce<T, false>(a, n, out, workspace, s); }
template <class T>
void sum_squares(const T* a, int64_t n, float* out, float* workspace, Stream s) { reduce<T, true>(a, n, out, workspace, s); }

#define LOOM_INST(T)                                                                  \
  template void axpby<T>(const T*, const T*, T*, int64_t, float, float, Stream);      \
  template void mul<T>(const T*, const T*, T*, int64_t, Stream);                      \
  template void scale<T>(const T*, T*, int64_t, float, Stream);                       \
  template void add_bias<T>(const T*, const T*, T*, int64_t, int64_t, Stream);        \
  template void sum_rows<T, T>(const T*, T*, int64_t, int64_t, bool, Stream);         \
  template void fill<T>(T*, int64_t, float, Stream);                                  \
  template void softcap_forward<T>(const T*, T*, int64_t, float, Stream);             \
  template void softcap_backward<T>(const T*, const T*, T*, int64_t, float, Stream);  \
  template void sum<T>(const T*, int64_t, float*, float*, Stream);                    \
  template void sum_squares<T>(const T*, int64_t, float*, float*, Stream);
LOOM_INST(float)
LOOM_INST(bf16)
#undef LOOM_INST
template void sum_rows<bf16, float>(const bf16*, float*, int64_t, int64_t, bool, Stream);
template void copy_strided<float, float>(const float*, const StridedLayout&, float*, Stream);
template void copy_strided<float, bf16>(const float*, const StridedLayout&, bf16*, Stream);
template void copy_strided<bf16, float>(const bf16*, const StridedLayout&, float*, Stream);
template void copy_strided<bf16, bf16>(const bf16*, const StridedLayout&, bf16*, Stream);

}  // namespace loom::cuda
