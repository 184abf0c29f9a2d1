// CUDA kernels for kernels/norm.h: RMSNorm forward (one block per row) and backward (a block walks
// a fixed set of rows: dx per row, dw column sums in shared memory, then a fixed-order second pass).
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/norm.h"

namespace loom::cuda {
namespace {

// About 8 columns per thread, a multiple of 32 threads, between 32 and 1024.
int threads_for(int64_t cols) {
  int64_t t = ((cols + 7) / 8 + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > 1024 ? 1024 : t));
}

// Backward grid: enough blocks for ~2^18 resident threads, never more than rows. The dw workspace
// holds one partial row of cols floats per block.
int64_t backward_blocks(int64_t rows, int64_t cols) {
  const int64_t b = (int64_t(1) << 18) / threads_for(cols);
  return rows < b ? rows : b;
}

// y[row, :] = x[row, :] * rstd * g. One block per row; columns in groups of N per thread.
// Launched with up to 1024 threads: __launch_bounds__ keeps registers within 64 per thread.
// With a residual: the row is first h = x + residual, rounded to T and written to `sum` (as the
// unfused add writes it), and the norm is taken of that h (each thread re-reads what it wrote).
template <class T, int N>
__global__ void __launch_bounds__(1024)
    rms_forward_kernel(const T* x, const T* w, T* y, float* rstd, int64_t cols, float eps, bool add_one,
                       const T* residual, T* sum, int64_t ldy) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * ldy;
  const int64_t step = int64_t(blockDim.x) * N;
  float ss = 0.f;
  for (int64_t c = int64_t(threadIdx.x) * N; c < cols; c += step) {
    float v[N];
    load_vec<N>(xr + c, v);
    if (residual) {
      float rv[N];
      load_vec<N>(residual + row * cols + c, rv);
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = v[k] + rv[k];
      store_vec<N>(sum + row * cols + c, v);
      load_vec<N>(sum + row * cols + c, v);  // the rounded h
    }
#pragma unroll
    for (int k = 0; k < N; ++k) ss += v[k] * v[k];
  }
  if (residual) xr = sum + row * cols;
  ss = block_sum(ss);
  const float inv = 1.f / sqrtf(ss / float(cols) + eps);
  if (rstd != nullptr && threadIdx.x == 0) rstd[row] = inv;
  for (int64_t c = int64_t(threadIdx.x) * N; c < cols; c += step) {
    float v[N], g[N], o[N];
    load_vec<N>(xr + c, v);
    load_vec<N>(w + c, g);
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = v[k] * inv * (add_one ? 1.f + g[k] : g[k]);
    store_vec<N>(yr + c, o);
  }
}

// dx = r g dy - x r^3 / cols * sum(dy g x) per row. With partial != nullptr, the block also sums
// dy x r over its rows (row = blockIdx.x, + gridDim.x, ...) into shared memory and writes that
// column sum to partial[blockIdx.x, :]. Column c = G * N + k (G = group index) is kept at
// acc[k * (cols / N) + G] so a warp touches consecutive banks; every thread owns its columns.
// With dres: dx = dres + (dx rounded to T), rounded again: what adding the residual path's
// gradient after the unfused backward gives, bit for bit.
template <class T, int N>
__global__ void __launch_bounds__(1024)
    rms_backward_kernel(const T* x, const T* w, const float* rstd, const T* dy, T* dx, float* partial, int64_t rows,
                        int64_t cols, bool add_one, const T* dres) {
  extern __shared__ float acc[];  // [cols] when partial != nullptr
  const int64_t groups = cols / N;
  const bool want_dw = partial != nullptr;
  if (want_dw)
    for (int64_t gi = threadIdx.x; gi < groups; gi += blockDim.x)
#pragma unroll
      for (int k = 0; k < N; ++k) acc[k * groups + gi] = 0.f;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    const T* dyr = dy + row * cols;
    T* dxr = dx + row * cols;
    const float r = rstd[row];
    float dot = 0.f;
    for (int64_t gi = threadIdx.x; gi < groups; gi += blockDim.x) {
      float xv[N], dv[N], g[N];
      load_vec<N>(xr + gi * N, xv);
      load_vec<N>(dyr + gi * N, dv);
      load_vec<N>(w + gi * N, g);
#pragma unroll
      for (int k = 0; k < N; ++k) dot += dv[k] * (add_one ? 1.f + g[k] : g[k]) * xv[k];
    }
    dot = block_sum(dot);
    const float coef = dot * r * r * r / float(cols);
    for (int64_t gi = threadIdx.x; gi < groups; gi += blockDim.x) {
      float xv[N], dv[N], g[N], o[N];
      load_vec<N>(xr + gi * N, xv);
      load_vec<N>(dyr + gi * N, dv);
      load_vec<N>(w + gi * N, g);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        o[k] = r * (add_one ? 1.f + g[k] : g[k]) * dv[k] - xv[k] * coef;
        if (want_dw) acc[k * groups + gi] += dv[k] * xv[k] * r;
      }
      if (dres) {
        float rv[N];
        T rounded[N];
#pragma unroll
        for (int k = 0; k < N; ++k) {
          store(&rounded[k], o[k]);
          o[k] = load(&rounded[k]);
        }
        load_vec<N>(dres + row * cols + gi * N, rv);
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] = rv[k] + o[k];
      }
      store_vec<N>(dxr + gi * N, o);
    }
  }
  if (want_dw)
    for (int64_t gi = threadIdx.x; gi < groups; gi += blockDim.x)
#pragma unroll
      for (int k = 0; k < N; ++k) partial[int64_t(blockIdx.x) * cols + gi * N + k] = acc[k * groups + gi];
}

// dw[c] += sum_p partial[p, c] in a fixed order: 32 columns per block, 8 row slices, combined in
// slice order. Same input, same bits.
__global__ void dw_reduce_kernel(const float* partial, int64_t parts, int64_t cols, float* dw) {
  __shared__ float slice[8][33];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.f;
  if (c < cols)
    for (int64_t p = threadIdx.y; p < parts; p += 8) s += partial[p * cols + c];
  slice[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) t += slice[j][threadIdx.x];
    dw[c] += t;
  }
}

template <class T, int N>
void launch_forward(const T* x, const T* w, T* y, float* rstd, int64_t rows, int64_t cols, float eps, bool add_one,
                    const T* residual, T* sum, int64_t ldy, Stream s) {
  rms_forward_kernel<T, N><<<static_cast<unsigned>(rows), threads_for(cols), 0, s>>>(x, w, y, rstd, cols, eps,
                                                                                   add_one, residual, sum, ldy);
}

template <class T, int N>
void launch_backward(const T* x, const T* w, const float* rstd, const T* dy, T* dx, float* partial, int64_t rows,
                     int64_t cols, bool add_one, const T* dres, Stream s) {
  const size_t smem = partial != nullptr ? static_cast<size_t>(cols) * sizeof(float) : 0;
  if (smem > 48 * 1024) {
    int dev = 0, optin = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&dev));
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    LOOM_CHECK(smem <= static_cast<size_t>(optin), "rms_norm_backward: cols=", cols, " needs ", smem,
               " bytes of shared memory for dw, the device allows ", optin);
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(rms_backward_kernel<T, N>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  }
  const auto blocks = static_cast<unsigned>(backward_blocks(rows, cols));
  rms_backward_kernel<T, N><<<blocks, threads_for(cols), smem, s>>>(x, w, rstd, dy, dx, partial, rows, cols,
                                                                     add_one, dres);
}

}  // namespace

template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, float* rstd, int64_t rows, int64_t cols, float eps,
                      bool add_one, Stream s, const T* residual, T* sum, int64_t ldy) {
  LOOM_CHECK(rows >= 0 && rows <= INT32_MAX && cols > 0, "rms_norm_forward: bad shape [", rows, ", ", cols, "]");
  LOOM_CHECK(!residual == !sum, "rms_norm_forward: a residual needs the sum's output and the other way round");
  if (ldy == 0) ldy = cols;
  LOOM_CHECK(ldy >= cols, "rms_norm_forward: output row stride ", ldy, " under ", cols, " columns");
  if (rows == 0) return;
  if (cols % kVecN<T> == 0 && ldy % kVecN<T> == 0 && aligned16(x) && aligned16(w) && aligned16(y) &&
      (!residual || (aligned16(residual) && aligned16(sum))))
    launch_forward<T, kVecN<T>>(x, w, y, rstd, rows, cols, eps, add_one, residual, sum, ldy, s);
  else
    launch_forward<T, 1>(x, w, y, rstd, rows, cols, eps, add_one, residual, sum, ldy, s);
  LOOM_CUDA_LAUNCH_CHECK();
}

size_t rms_norm_backward_workspace_bytes(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<size_t>(backward_blocks(rows, cols)) * static_cast<size_t>(cols) * sizeof(float);
}

template <class T>
void rms_norm_backward(const T* x, const T* w, const float* rstd, const T* dy, T* dx, float* dw, int64_t rows,
                       int64_t cols, bool add_one, void* workspace, Stream s, const T* dres) {
  LOOM_CHECK(rows >= 0 && rows <= INT32_MAX && cols > 0, "rms_norm_backward: bad shape [", rows, ", ", cols, "]");
  LOOM_CHECK(dw == nullptr || workspace != nullptr, "rms_norm_backward: dw needs a workspace of ",
             rms_norm_backward_workspace_bytes(rows, cols), " bytes (rms_norm_backward_workspace_bytes)");
  if (rows == 0) return;
  float* partial = dw != nullptr ? static_cast<float*>(workspace) : nullptr;
  if (cols % kVecN<T> == 0 && aligned16(x) && aligned16(w) && aligned16(dy) && aligned16(dx) &&
      (!dres || aligned16(dres)))
    launch_backward<T, kVecN<T>>(x, w, rstd, dy, dx, partial, rows, cols, add_one, dres, s);
  else
    launch_backward<T, 1>(x, w, rstd, dy, dx, partial, rows, cols, add_one, dres, s);
  LOOM_CUDA_LAUNCH_CHECK();
  if (dw == nullptr) return;
  const dim3 block(32, 8);
  dw_reduce_kernel<<<static_cast<unsigned>((cols + 31) / 32), block, 0, s>>>(partial, backward_blocks(rows, cols),
                                                                           cols, dw);
  LOOM_CUDA_LAUNCH_CHECK();
}

#define LOOM_INST(T)                                                                                         \
  template void rms_norm_forward<T>(const T*, const T*, T*, float*, int64_t, int64_t, float, bool, Stream,   \
                                    const T*, T*, int64_t);                                                  \
  template void rms_norm_backward<T>(const T*, const T*, const float*, const T*, T*, float*, int64_t, int64_t, \
                                     bool, void*, Stream, const T*);
LOOM_INST(float)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cuda
