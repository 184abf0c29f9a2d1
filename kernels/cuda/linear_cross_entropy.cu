// CUDA path of kernels/linear_cross_entropy.h: per chunk of rows, cuBLASLt logits (T in, f32
// accumulation, written in T: bf16 logits for bf16 inputs), one block per row for log-sum-exp, loss
// and dlogits (written in place over the logits), then the dh and dW GEMMs. The row scale 1/count is
// counted on the device; the loss sum is deterministic.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/softmax_common.cuh"
#include "kernels/linear_cross_entropy.h"

#include <algorithm>
#include <type_traits>

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kReduceThreads = 1024;

using softmax::capped;
using softmax::counts;
using softmax::merge;
using softmax::online_add;

// One block: *row_scale = 1 / #{i : counts(t_i)} (0 when none).
__global__ void __launch_bounds__(kReduceThreads)
    count_kernel(const int32_t* targets, int64_t n, int64_t vocab, int32_t ignore_index, float* row_scale) {
  float c = 0.f;  // exact up to 2^24 per thread
  for (int64_t i = threadIdx.x; i < n; i += kReduceThreads) c += counts(targets[i], vocab, ignore_index) ? 1.f : 0.f;
  c = block_sum(c);
  if (threadIdx.x == 0) *row_scale = c > 0.f ? 1.f / c : 0.f;
}

// One block: *loss = row_scale * sum_i row_loss[i], in a fixed order (deterministic).
__global__ void __launch_bounds__(kReduceThreads)
    loss_kernel(const float* row_loss, int64_t n, const float* row_scale, float* loss) {
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kReduceThreads) s += row_loss[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *loss = s * *row_scale;
}

// Grid rows blocks of kThreads; each thread takes V consecutive elements at a time (vocab % V == 0;
// V = 4 for f32 and 8 for bf16 are 16-byte loads). logits [rows, vocab] in T (row stride vocab);
// dlogits overwrite them in place, each element by the thread that read it.
template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    row_kernel(T* logits, const int32_t* targets, float* row_loss, const float* row_scale, int64_t vocab,
               float softcap, int32_t ignore_index) {
  constexpr int64_t kTile = int64_t(kThreads) * V;
  const int64_t r = blockIdx.x;
  const T* row = logits + r * vocab;
  T* grad = logits + r * vocab;
  const int32_t t = targets[r];
  if (!counts(t, vocab, ignore_index)) {  // nothing read: zero the gradient row freely
    for (int64_t v = threadIdx.x; v < vocab; v += kThreads) store(grad + v, 0.f);
    if (threadIdx.x == 0) row_loss[r] = 0.f;
    return;
  }
  float m = -INFINITY, l = 0.f;
  for (int64_t v0 = int64_t(threadIdx.x) * V; v0 < vocab; v0 += kTile) {
    float x[V];
    load_vec<V>(row + v0, x);
#pragma unroll
    for (int k = 0; k < V; ++k) online_add(m, l, capped(x[k], softcap));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
    merge(m, l, m2, l2);
  }
  __shared__ float warp_m[kThreads / 32], warp_l[kThreads / 32], shared_lse;
  if ((threadIdx.x & 31) == 0) {
    warp_m[threadIdx.x >> 5] = m;
    warp_l[threadIdx.x >> 5] = l;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    m = warp_m[0];
    l = warp_l[0];
    for (int w = 1; w < kThreads / 32; ++w) merge(m, l, warp_m[w], warp_l[w]);
    shared_lse = l == 0.f ? m : m + logf(l);  // a NaN l (a NaN logit) stays NaN
  }
  __syncthreads();
  const float lse = shared_lse, scale = *row_scale;
  for (int64_t base = 0; base < vocab; base += kTile) {
    const int64_t v0 = base + int64_t(threadIdx.x) * V;
    const bool active = v0 < vocab;  // vocab % V == 0: a thread's V elements are all in or all out
    float x[V];
    if (!active) continue;
    load_vec<V>(row + v0, x);
    float g[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float z = x[k], dz = 1.f;
      if (softcap > 0.f) {
        const float th = tanhf(x[k] / softcap);
        z = softcap * th;
        dz = 1.f - th * th;
      }
      const bool hit = v0 + k == t;
      if (hit) row_loss[r] = lse - z;
      g[k] = (expf(z - lse) - (hit ? 1.f : 0.f)) * dz * scale;
    }
    store_vec<V>(grad + v0, g);
  }
}

// One row_kernel launch over `rows` rows of logits: the widest vector the row length allows
// (16-byte loads; rows start 256-byte aligned plus a multiple of vocab elements).
template <class T>
void launch_rows(T* logits, int64_t rows, const int32_t* targets, float* row_loss, const float* row_scale,
                 int64_t vocab, float softcap, int32_t ignore_index, Stream s) {
  const unsigned grid = static_cast<unsigned>(rows);
  if constexpr (sizeof(T) == 2) {
    if (vocab % 8 == 0) {
      row_kernel<T, 8><<<grid, kThreads, 0, s>>>(logits, targets, row_loss, row_scale, vocab, softcap, ignore_index);
      return;
    }
  }
  if (vocab % 4 == 0)
    row_kernel<T, 4><<<grid, kThreads, 0, s>>>(logits, targets, row_loss, row_scale, vocab, softcap, ignore_index);
  else
    row_kernel<T, 1><<<grid, kThreads, 0, s>>>(logits, targets, row_loss, row_scale, vocab, softcap, ignore_index);
}

template <class T>
__global__ void scale_kernel(T* x, const float* scalar, int64_t n) {
  const float s = *scalar;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(x + i, load(x + i) * s);
}

constexpr size_t align256(size_t b) { return (b + 255) / 256 * 256; }

template <class T>
constexpr GemmType gemm_type() {
  return std::is_same_v<T, bf16> ? GemmType::kBF16 : GemmType::kF32;
}

}  // namespace

size_t linear_cross_entropy_scratch_bytes(int64_t n, int64_t vocab, int64_t chunk_rows, bool bf16_input) {
  const int64_t rows = linear_cross_entropy_chunk_rows(n, vocab, chunk_rows, bf16_input);
  return 256 + align256(size_t(std::max<int64_t>(n, 1)) * 4) +
         size_t(std::max<int64_t>(rows, 1)) * size_t(vocab) * size_t(linear_cross_entropy_logit_bytes(bf16_input));
}

template <class T>
void linear_cross_entropy(const T* h, const T* w, const int32_t* targets, float* loss, T* dh, float* dw, int64_t n,
                          int64_t vocab, int64_t hidden, float softcap, int32_t ignore_index, int64_t chunk_rows,
                          void* scratch, cublasLtHandle_t handle, GemmWorkspace ws, Stream s) {
  const char* op = "cuda::linear_cross_entropy";
  LOOM_CHECK(n >= 0 && n <= 0x7fffffffLL && vocab > 0 && hidden > 0, op, ": bad shape n=", n, " vocab=", vocab,
             " hidden=", hidden);
  LOOM_CHECK(softcap >= 0.f, op, ": softcap must be >= 0 (0 = off), got ", softcap);
  LOOM_CHECK(scratch != nullptr && (reinterpret_cast<uintptr_t>(scratch) & 255u) == 0, op,
             ": scratch must be non-null and 256-byte aligned");
  LOOM_CHECK(loss != nullptr, op, ": loss must be non-null");
  constexpr bool is_bf16 = std::is_same_v<T, bf16>;
  const int64_t rows_max = linear_cross_entropy_chunk_rows(n, vocab, chunk_rows, is_bf16);
  char* base = static_cast<char*>(scratch);
  float* row_scale = reinterpret_cast<float*>(base);
  float* row_loss = reinterpret_cast<float*>(base + 256);
  T* logits = reinterpret_cast<T*>(base + 256 + align256(size_t(std::max<int64_t>(n, 1)) * 4));
  T* dlogits = logits;  // overwritten in place by the row pass
  static_assert(sizeof(T) == (is_bf16 ? 2 : 4));  // the scratch's logits: linear_cross_entropy_logit_bytes

  if (n == 0 && dw) LOOM_CUDA_CHECK(cudaMemsetAsync(dw, 0, size_t(vocab) * size_t(hidden) * sizeof(float), s));
  count_kernel<<<1, kReduceThreads, 0, s>>>(targets, n, vocab, ignore_index, row_scale);
  LOOM_CUDA_LAUNCH_CHECK();
  for (int64_t r0 = 0; r0 < n; r0 += rows_max) {
    const int64_t rows = std::min(rows_max, n - r0);
    // logits [rows, vocab] (T) = h[r0:r0+rows] [rows, hidden] * w^T [hidden, vocab]
    GemmArgs g;
    g.m = rows, g.n = vocab, g.k = hidden, g.trans_b = true;
    g.a = h + r0 * hidden, g.lda = hidden;
    g.b = w, g.ldb = hidden;
    g.c = logits, g.ldc = vocab;
    g.ab_type = g.c_type = gemm_type<T>();
    gemm(g, handle, ws, s);
    launch_rows<T>(logits, rows, targets + r0, row_loss + r0, row_scale, vocab, softcap, ignore_index, s);
    LOOM_CUDA_LAUNCH_CHECK();
    if (dh) {
      // dh[r0:r0+rows] [rows, hidden] (T) = dlogits [rows, vocab] * w [vocab, hidden]
      GemmArgs d;
      d.m = rows, d.n = hidden, d.k = vocab;
      d.a = dlogits, d.lda = vocab;
      d.b = w, d.ldb = hidden;
      d.c = dh + r0 * hidden, d.ldc = hidden;
      d.ab_type = d.c_type = gemm_type<T>();
      gemm(d, handle, ws, s);
    }
    if (dw) {
      // dw [vocab, hidden] f32 (+)= dlogits^T [vocab, rows] * h[r0:r0+rows] [rows, hidden]; the
      // first chunk overwrites (beta 0), so dw needs no zero-fill
      GemmArgs d;
      d.m = vocab, d.n = hidden, d.k = rows, d.trans_a = true;
      d.a = dlogits, d.lda = vocab;
      d.b = h + r0 * hidden, d.ldb = hidden;
      d.c = dw, d.ldc = hidden;
      d.ab_type = gemm_type<T>(), d.c_type = GemmType::kF32;
      d.beta = r0 == 0 ? 0.f : 1.f;
      gemm(d, handle, ws, s);
    }
  }
  loss_kernel<<<1, kReduceThreads, 0, s>>>(row_loss, n, row_scale, loss);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <class T>
void scale_by_scalar(T* x, const float* scalar, int64_t n, Stream s) {
  LOOM_CHECK(n >= 0, "cuda::scale_by_scalar: bad size ", n);
  if (n == 0) return;
  scale_kernel<T><<<grid_for(n, 256, 8), 256, 0, s>>>(x, scalar, n);
  LOOM_CUDA_LAUNCH_CHECK();
}

#define LOOM_INST(T)                                                                                              \
  template void linear_cross_entropy<T>(const T*, const T*, const int32_t*, float*, T*, float*, int64_t, int64_t, \
                                        int64_t, float, int32_t, int64_t, void*, cublasLtHandle_t, GemmWorkspace, \
                                        Stream);                                                                  \
  template void scale_by_scalar<T>(T*, const float*, int64_t, Stream);
LOOM_INST(float)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cuda
