// CUDA kernels for kernels/elementwise.h (all but the strided copies, which are in
// copy_strided.cu): 16-byte vectorized grid-stride maps, column sums, and deterministic reductions.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/elementwise.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;
// Map kernels: kBlocksPerSm blocks of kThreads per SM, all resident at once (__launch_bounds__
// keeps registers <= 64), so the grid-stride loop has no second partial wave.
constexpr int kBlocksPerSm = 4;

// ---------------------------------------------------------------------------------------------
// Elementwise maps: out[i] = op(in_0[i], ..., in_{A-1}[i]). The loop walks packs of N elements
// (N * sizeof(T) = 16 bytes on the vector path, N = 1 when a pointer is misaligned), two packs
// per iteration (p and p + stride, both loaded before either is stored, so more bytes are in
// flight), then the n % N tail by the first threads. Element-for-element aliasing of out with an
// input is safe: every element is read before the same element is written, by the same thread.

template <class T, int A>
struct Inputs {
  const T* p[A > 0 ? A : 1];
};

template <int U, int N, int A, class T, class Op>
__device__ __forceinline__ void map_packs(const Inputs<T, A>& in, T* out, int64_t first, int64_t step,
                                          const Op& op) {
  constexpr int kA = A > 0 ? A : 1;
  float x[U][kA][N];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int a = 0; a < A; ++a) load_vec<N>(in.p[a] + (first + u * step) * N, x[u][a]);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float o[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float args[kA] = {};
#pragma unroll
      for (int a = 0; a < A; ++a) args[a] = x[u][a][k];
      o[k] = op(args);
    }
    store_vec<N>(out + (first + u * step) * N, o);
  }
}

template <int N, int A, class T, class Op>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) map_kernel(Inputs<T, A> in, T* out, int64_t n, Op op) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t packs = n / N;
  int64_t p = tid;
  for (; p + stride < packs; p += 2 * stride) map_packs<2, N>(in, out, p, stride, op);
  if (p < packs) map_packs<1, N>(in, out, p, 0, op);
  const int64_t i = packs * N + tid;  // tail: fewer than N elements, the grid has >= 256 threads
  if (N > 1 && i < n) map_packs<1, 1>(in, out, i, 0, op);
}

template <class T, int A, class Op>
void launch_map(Inputs<T, A> in, T* out, int64_t n, Op op, Stream s) {
  constexpr int kN = kVecN<T>;
  bool vec = aligned16(out);
  for (int a = 0; a < A; ++a) vec = vec && aligned16(in.p[a]);
  if (vec)
    map_kernel<kN, A><<<grid_for(n / kN, kThreads, kBlocksPerSm), kThreads, 0, s>>>(in, out, n, op);
  else
    map_kernel<1, A><<<grid_for(n, kThreads, kBlocksPerSm), kThreads, 0, s>>>(in, out, n, op);
  LOOM_CUDA_LAUNCH_CHECK();
}

struct AxpbyOp {
  float alpha, beta;
  __device__ float operator()(const float* x) const { return alpha * x[0] + beta * x[1]; }
};
struct MulOp {
  __device__ float operator()(const float* x) const { return x[0] * x[1]; }
};
struct ScaleOp {
  float s;
  __device__ float operator()(const float* x) const { return s * x[0]; }
};
struct FillOp {
  float v;
  __device__ float operator()(const float*) const { return v; }
};
struct SoftcapForwardOp {
  float cap;
  __device__ float operator()(const float* x) const { return cap * tanhf(x[0] / cap); }
};
struct SoftcapBackwardOp {  // x = (a, dout)
  float cap;
  __device__ float operator()(const float* x) const {
    const float t = tanhf(x[0] / cap);
    return x[1] * (1.f - t * t);
  }
};

// ---------------------------------------------------------------------------------------------
// out[r, c] = a[r, c] + bias[c]: packs of N never straddle a row because cols % N == 0 on the
// vector path; the bias pack is re-read per row (it stays in L1/L2).
template <class T, int N>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    add_bias_kernel(const T* a, const T* bias, T* out, int64_t rows, int64_t cols) {
  const int64_t packs_per_row = cols / N, packs = rows * packs_per_row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    const int64_t c = (p % packs_per_row) * N;
    float x[N], b[N];
    load_vec<N>(a + p * N, x);
    load_vec<N>(bias + c, b);
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] += b[k];
    store_vec<N>(out + p * N, x);
  }
}

// ---------------------------------------------------------------------------------------------
// Column sums of a [rows, cols] matrix, two passes with a fixed summation order.
// Pass 1: block (bx, by) owns the 32 * V columns starting at bx * 32 * V and the rows
// [by * rps, min(rows, (by + 1) * rps)). Thread (tx, ty) adds rows ty, ty + 8, ... of that range
// for its V columns; the 8 row slices are combined in slice order through shared memory. With
// partial != nullptr the block writes partial[by, c]; otherwise (one split) it writes
// out[c] = (accumulate ? out[c] : 0) + sum. Pass 2 is the same kernel on the [splits, cols] f32
// partials with one split. Shared memory holds acc[ty][k][tx] (bank-conflict free).
constexpr int kSumRowsX = 32, kSumRowsY = 8;
constexpr int64_t kSumRowsTargetBlocks = 2048;  // pass-1 blocks to aim for (~2 waves of ~8/SM)
constexpr int64_t kSumRowsMinRows = 64;         // rows per split at least

template <class T, int V, class O>
__global__ void __launch_bounds__(kSumRowsX* kSumRowsY)
    sum_rows_kernel(const T* a, O* out, float* partial, int64_t rows, int64_t cols, int64_t rows_per_split,
                    bool accumulate) {
  __shared__ float slice[kSumRowsY][V][kSumRowsX];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tile0 = int64_t(blockIdx.x) * kSumRowsX * V;
  const int64_t c0 = tile0 + int64_t(tx) * V;  // this thread's first column; cols % V == 0
  const int64_t r_begin = int64_t(blockIdx.y) * rows_per_split;
  const int64_t r_end = r_begin + rows_per_split < rows ? r_begin + rows_per_split : rows;
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.f;
  if (c0 < cols) {
#pragma unroll 4
    for (int64_t r = r_begin + ty; r < r_end; r += kSumRowsY) {
      float v[V];
      load_vec<V>(a + r * cols + c0, v);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) slice[ty][k][tx] = acc[k];
  __syncthreads();
  // Local column j = t * V + k of the tile lives at slice[.][k][t].
  for (int j = ty * kSumRowsX + tx; j < kSumRowsX * V; j += kSumRowsX * kSumRowsY) {
    const int64_t c = tile0 + j;
    if (c >= cols) break;
    float sum = 0.f;
#pragma unroll
    for (int y = 0; y < kSumRowsY; ++y) sum += slice[y][j % V][j / V];
    if (partial != nullptr) {
      partial[int64_t(blockIdx.y) * cols + c] = sum;
    } else {
      store(out + c, (accumulate ? load(out + c) : 0.f) + sum);
    }
  }
}

// Row splits of pass 1, a function of the shape only (so the workspace size is too).
int64_t sum_rows_splits(int64_t rows, int64_t cols) {
  if (rows <= kSumRowsMinRows || cols <= 0) return 1;
  const int64_t tiles = (cols + 255) / 256;  // column tiles of the bf16 vector path
  const int64_t want = (kSumRowsTargetBlocks + tiles - 1) / tiles;
  const int64_t by_rows = (rows + kSumRowsMinRows - 1) / kSumRowsMinRows;
  const int64_t s = want < by_rows ? want : by_rows;
  return s < 1 ? 1 : s;
}

template <class T, int V, class O>
void launch_sum_rows(const T* a, O* out, float* partial, int64_t rows, int64_t cols, int64_t splits, bool accumulate,
                     Stream s) {
  const int64_t rps = splits > 1 ? (rows + splits - 1) / splits : (rows > 0 ? rows : 1);
  const int64_t used = rows > 0 ? (rows + rps - 1) / rps : 1;
  const dim3 grid(static_cast<unsigned>((cols + kSumRowsX * V - 1) / (kSumRowsX * V)), static_cast<unsigned>(used));
  sum_rows_kernel<T, V, O><<<grid, dim3(kSumRowsX, kSumRowsY), 0, s>>>(a, out, used > 1 ? partial : nullptr, rows,
                                                                       cols, rps, accumulate);
  LOOM_CUDA_LAUNCH_CHECK();
  if (used > 1) {  // pass 2: the [used, cols] partials, one split, straight into out
    const dim3 grid2(static_cast<unsigned>((cols + kSumRowsX - 1) / kSumRowsX), 1);
    sum_rows_kernel<float, 1, O><<<grid2, dim3(kSumRowsX, kSumRowsY), 0, s>>>(partial, out, nullptr, used, cols,
                                                                               used, accumulate);
    LOOM_CUDA_LAUNCH_CHECK();
  }
}

// ---------------------------------------------------------------------------------------------
// Pass 1 of sum / sum of squares: each thread adds canonical packs of 8 elements (p = tid,
// tid + stride, ...; within a pack in order) then, for the n % 8 tail, element packs * 8 + tid;
// the block sums its threads with block_sum into partial[blockIdx.x]. The vector and scalar
// paths add the same values in the same order, so alignment does not change the result.
// Pass 2: one block sums the partials in a fixed order. Same input, same bits, every run.
constexpr int kReducePack = 8;
constexpr int kReduceBlocksPerSm = 4;

template <class T, bool kSquare, bool kVec>
__global__ void __launch_bounds__(kThreads, kReduceBlocksPerSm)
    reduce_partial_kernel(const T* a, int64_t n, float* partial) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t packs = n / kReducePack;
  float acc = 0.f;
#pragma unroll 2
  for (int64_t p = tid; p < packs; p += stride) {
    float v[kReducePack];
    if constexpr (kVec) {
      load_vec<kReducePack>(a + p * kReducePack, v);
    } else {
#pragma unroll
      for (int k = 0; k < kReducePack; ++k) v[k] = load(a + p * kReducePack + k);
    }
#pragma unroll
    for (int k = 0; k < kReducePack; ++k) acc += kSquare ? v[k] * v[k] : v[k];
  }
  const int64_t i = packs * kReducePack + tid;
  if (i < n) {
    const float v = load(a + i);
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
  LOOM_CHECK(n >= 0, "cuda reduction: n = ", n);
  LOOM_CHECK(workspace != nullptr, "cuda reduction needs a workspace of ", kReduceWorkspaceFloats, " floats");
  // The grid depends on n and the device's SM count only: the same bits run to run on one device.
  int64_t blocks = (n / kReducePack + kThreads - 1) / kThreads;
  const int64_t resident = int64_t(sm_count()) * kReduceBlocksPerSm;
  blocks = blocks < resident ? blocks : resident;
  blocks = blocks < kReduceWorkspaceFloats ? blocks : kReduceWorkspaceFloats;
  blocks = blocks < 1 ? 1 : blocks;
  const auto grid = static_cast<unsigned>(blocks);
  if (aligned16(a))
    reduce_partial_kernel<T, kSquare, true><<<grid, kThreads, 0, s>>>(a, n, workspace);
  else
    reduce_partial_kernel<T, kSquare, false><<<grid, kThreads, 0, s>>>(a, n, workspace);
  LOOM_CUDA_LAUNCH_CHECK();
  reduce_final_kernel<<<1, 1024, 0, s>>>(workspace, static_cast<int>(blocks), out);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <class T>
void axpby(const T* a, const T* b, T* out, int64_t n, float alpha, float beta, Stream s) {
  LOOM_CHECK(n >= 0, "cuda axpby: n = ", n);
  if (n == 0) return;
  launch_map(Inputs<T, 2>{{a, b}}, out, n, AxpbyOp{alpha, beta}, s);
}
template <class T>
void mul(const T* a, const T* b, T* out, int64_t n, Stream s) {
  LOOM_CHECK(n >= 0, "cuda mul: n = ", n);
  if (n == 0) return;
  launch_map(Inputs<T, 2>{{a, b}}, out, n, MulOp{}, s);
}
template <class T>
void scale(const T* a, T* out, int64_t n, float sc, Stream s) {
  LOOM_CHECK(n >= 0, "cuda scale: n = ", n);
  if (n == 0) return;
  launch_map(Inputs<T, 1>{{a}}, out, n, ScaleOp{sc}, s);
}
template <class T>
void add_bias(const T* a, const T* bias, T* out, int64_t rows, int64_t cols, Stream s) {
  LOOM_CHECK(rows >= 0 && cols >= 0, "cuda add_bias: rows = ", rows, ", cols = ", cols);
  if (rows * cols == 0) return;
  constexpr int kN = kVecN<T>;
  if (cols % kN == 0 && aligned16(a) && aligned16(bias) && aligned16(out))
    add_bias_kernel<T, kN><<<grid_for(rows * cols / kN, kThreads, kBlocksPerSm), kThreads, 0, s>>>(a, bias, out, rows,
                                                                                                   cols);
  else
    add_bias_kernel<T, 1><<<grid_for(rows * cols, kThreads, kBlocksPerSm), kThreads, 0, s>>>(a, bias, out, rows, cols);
  LOOM_CUDA_LAUNCH_CHECK();
}

size_t sum_rows_workspace_bytes(int64_t rows, int64_t cols) {
  const int64_t splits = sum_rows_splits(rows, cols);
  return splits > 1 ? static_cast<size_t>(splits) * static_cast<size_t>(cols) * sizeof(float) : 0;
}

template <class T, class O>
void sum_rows(const T* a, O* out, int64_t rows, int64_t cols, bool accumulate, void* workspace, Stream s) {
  LOOM_CHECK(rows >= 0 && cols >= 0, "cuda sum_rows: rows = ", rows, ", cols = ", cols);
  if (cols == 0) return;
  const int64_t splits = sum_rows_splits(rows, cols);
  LOOM_CHECK(splits == 1 || workspace != nullptr, "cuda sum_rows: [", rows, ", ", cols, "] needs a workspace of ",
             sum_rows_workspace_bytes(rows, cols), " bytes (sum_rows_workspace_bytes)");
  auto* partial = static_cast<float*>(workspace);
  constexpr int kV = kVecN<T>;
  if (cols % kV == 0 && aligned16(a))
    launch_sum_rows<T, kV>(a, out, partial, rows, cols, splits, accumulate, s);
  else
    launch_sum_rows<T, 1>(a, out, partial, rows, cols, splits, accumulate, s);
}

template <class T>
void fill(T* out, int64_t n, float value, Stream s) {
  LOOM_CHECK(n >= 0, "cuda fill: n = ", n);
  if (n == 0) return;
  launch_map(Inputs<T, 0>{{nullptr}}, out, n, FillOp{value}, s);
}

namespace {
struct BlockList {
  int32_t index[kScaleBlocksPerLaunch];
};
static_assert(sizeof(BlockList) + 64 < 4096, "kernel arguments are limited to 4 KiB");

// Block list.index[blockIdx.y] of out, grid-strided over its elements by blockIdx.x.
template <class T>
__global__ void __launch_bounds__(kThreads) scale_blocks_kernel(T* out, int64_t block, BlockList list, float beta) {
  T* b = out + int64_t(list.index[blockIdx.y]) * block;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < block; i += stride)
    store(b + i, beta == 0.f ? 0.f : beta * load(b + i));
}
}  // namespace

template <class T>
void scale_blocks(T* out, int64_t block, const int32_t* blocks, int64_t count, float beta, Stream s) {
  LOOM_CHECK(block >= 0 && count >= 0, "cuda scale_blocks: block = ", block, ", count = ", count);
  if (beta == 1.f || block == 0) return;
  // Enough blocks of threads along x to cover the GPU once with the blocks listed along y.
  const int64_t per = (block + kThreads - 1) / kThreads;
  for (int64_t first = 0; first < count; first += kScaleBlocksPerLaunch) {
    const int n = int(std::min<int64_t>(kScaleBlocksPerLaunch, count - first));
    BlockList list{};
    for (int i = 0; i < n; ++i) list.index[i] = blocks[first + i];
    const int64_t want = std::max<int64_t>(1, int64_t(sm_count()) * kBlocksPerSm * 2 / n);
    const unsigned x = unsigned(std::min<int64_t>(per, want));
    scale_blocks_kernel<T><<<dim3(x, unsigned(n)), kThreads, 0, s>>>(out, block, list, beta);
    LOOM_CUDA_LAUNCH_CHECK();
  }
}

template <class T>
void softcap_forward(const T* a, T* out, int64_t n, float cap, Stream s) {
  LOOM_CHECK(cap > 0.f, "softcap_forward: cap must be positive, got ", cap);
  LOOM_CHECK(n >= 0, "cuda softcap_forward: n = ", n);
  if (n == 0) return;
  launch_map(Inputs<T, 1>{{a}}, out, n, SoftcapForwardOp{cap}, s);
}
template <class T>
void softcap_backward(const T* a, const T* dout, T* da, int64_t n, float cap, Stream s) {
  LOOM_CHECK(cap > 0.f, "softcap_backward: cap must be positive, got ", cap);
  LOOM_CHECK(n >= 0, "cuda softcap_backward: n = ", n);
  if (n == 0) return;
  launch_map(Inputs<T, 2>{{a, dout}}, da, n, SoftcapBackwardOp{cap}, s);
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
  template void sum_rows<T, T>(const T*, T*, int64_t, int64_t, bool, void*, Stream);  \
  template void fill<T>(T*, int64_t, float, Stream);                                  \
  template void scale_blocks<T>(T*, int64_t, const int32_t*, int64_t, float, Stream); \
  template void softcap_forward<T>(const T*, T*, int64_t, float, Stream);             \
  template void softcap_backward<T>(const T*, const T*, T*, int64_t, float, Stream);  \
  template void sum<T>(const T*, int64_t, float*, float*, Stream);                    \
  template void sum_squares<T>(const T*, int64_t, float*, float*, Stream);
LOOM_INST(float)
LOOM_INST(bf16)
#undef LOOM_INST
template void sum_rows<bf16, float>(const bf16*, float*, int64_t, int64_t, bool, void*, Stream);

}  // namespace loom::cuda
