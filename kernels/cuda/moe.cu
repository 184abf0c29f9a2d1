// CUDA kernels for kernels/moe.h, grouping by expert and combining: the dispatch counts each chunk
// of assignments per expert (integers), scans, then scatters stably (one warp per chunk, in order);
// the combine takes one block per token. No floating-point atomics: every result is the same bits
// run after run. Routing and the load-balancing loss are in moe_route.cu.
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/moe.h"

namespace loom::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }

// ---- dispatch ----

constexpr int kTiles = 32, kChunk = kTiles * 32;  // assignments per warp in the count and scatter kernels
constexpr int kDispatchWarps = 4;
constexpr int kScanBatch = 16;

// Grid ceil(chunks / kDispatchWarps) blocks of kDispatchWarps warps, warp w of block b on chunk
// c = b kDispatchWarps + w: chunk_counts[c, e] = its assignments to expert e.
__global__ void __launch_bounds__(kDispatchWarps * 32)
    dispatch_count_kernel(const int32_t* ids, int64_t n, int experts, int64_t chunks, int* chunk_counts) {
  extern __shared__ int hist[];  // [kDispatchWarps, experts]
  const int lane = lane_id(), warp = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * kDispatchWarps + warp;
  if (c >= chunks) return;  // the whole warp; no block-wide barrier follows
  int* h = hist + warp * experts;
  for (int e = lane; e < experts; e += 32) h[e] = 0;
  __syncwarp();
  const int64_t end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
  for (int64_t a = c * kChunk + lane; a < end; a += 32) {
    const int32_t e = ids[a];
    if (e >= 0 && e < experts) atomicAdd(&h[e], 1);
  }
  __syncwarp();
  for (int e = lane; e < experts; e += 32) chunk_counts[c * experts + e] = h[e];
}

// One block of kMoeMaxExperts threads, thread e: chunk_counts[c, e] becomes the count of expert e
// in the chunks before c; offsets = the exclusive scan of the experts' totals, offsets[E] = sum.
__global__ void __launch_bounds__(kMoeMaxExperts)
    dispatch_scan_kernel(int* chunk_counts, int64_t chunks, int experts, int64_t* offsets) {
  __shared__ int warp_total[32];
  const int e = threadIdx.x, lane = lane_id(), warp = threadIdx.x >> 5;
  int run = 0;
  if (e < experts)
    for (int64_t c0 = 0; c0 < chunks; c0 += kScanBatch) {  // a batch of loads in flight, then the stores
      int x[kScanBatch];
#pragma unroll
      for (int i = 0; i < kScanBatch; ++i) x[i] = c0 + i < chunks ? chunk_counts[(c0 + i) * experts + e] : 0;
#pragma unroll
      for (int i = 0; i < kScanBatch; ++i)
        if (c0 + i < chunks) {
          chunk_counts[(c0 + i) * experts + e] = run;
          run += x[i];
        }
    }
  int incl = run;  // inclusive scan over the block: within the warp, then over the warps' totals
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int v = lane < int(blockDim.x >> 5) ? warp_total[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(kFull, v, o);
      if (lane >= o) v += y;
    }
    warp_total[lane] = v;
  }
  __syncthreads();
  const int excl = incl - run + (warp > 0 ? warp_total[warp - 1] : 0);
  if (e < experts) offsets[e] = excl;
  if (e == experts - 1) offsets[experts] = excl + run;
}

// Grid as the count kernel. Each warp loads its chunk (lane l holds assignments l, l + 32, ...),
// then walks it 32 assignments at a time, in order: an assignment's row is its expert's next free
// row plus the lanes before it with the same expert (__match_any_sync); the lowest of those lanes
// then advances the expert's next free row.
__global__ void __launch_bounds__(kDispatchWarps * 32)
    dispatch_scatter_kernel(const int32_t* ids, int64_t n, int k, int experts, int64_t chunks,
                            const int* chunk_counts, const int64_t* offsets, int32_t* token_of_row,
                            int32_t* row_of) {
  extern __shared__ int next_row[];  // [kDispatchWarps, experts]
  const int lane = lane_id(), warp = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * kDispatchWarps + warp;
  if (c >= chunks) return;
  int* next = next_row + warp * experts;
  for (int e = lane; e < experts; e += 32) next[e] = static_cast<int>(offsets[e]) + chunk_counts[c * experts + e];
  __syncwarp();
  const int64_t end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
  int32_t id[kTiles];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int64_t a = c * kChunk + i * 32 + lane;
    id[i] = a < end ? ids[a] : -1;
  }
  const unsigned before = (1u << lane) - 1u;
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int64_t a = c * kChunk + i * 32 + lane;
    const bool ok = id[i] >= 0 && id[i] < experts;  // false past the end
    const unsigned peers = __match_any_sync(kFull, ok ? id[i] : -1);
    if (ok) {
      const int row = next[id[i]] + __popc(peers & before);
      row_of[a] = row;
      token_of_row[row] = static_cast<int32_t>(a / k);
    }
    __syncwarp();
    if (ok && lane == __ffs(peers) - 1) next[id[i]] += __popc(peers);
    __syncwarp();
  }
}

int64_t dispatch_chunks(int64_t n) { return (n + kChunk - 1) / kChunk; }

// ---- combine ----

constexpr int kCombineThreads = 128;

// Stages token t's K rows and weights in shared memory; a row outside [0, rows) becomes -1.
__device__ __forceinline__ void stage_choices(const int32_t* row_of, const float* w, int64_t t, int k, int64_t rows,
                                              int* r, float* wt) {
  if (threadIdx.x < k) {
    const int32_t x = row_of[t * k + threadIdx.x];
    r[threadIdx.x] = x >= 0 && x < rows ? x : -1;
    wt[threadIdx.x] = w[t * k + threadIdx.x];
  }
  __syncthreads();
}

// Grid T blocks: y[t, :] = sum_j w_tj ys[r_tj, :], N columns per access, each product and sum
// rounded on its own (no fused multiply-add) as the CPU reference rounds them.
template <class T, int N>
__global__ void __launch_bounds__(kCombineThreads)
    combine_forward_kernel(const T* ys, const int32_t* row_of, const float* w, T* y, int64_t rows, int k,
                           int64_t h) {
  __shared__ int r[kMoeMaxK];
  __shared__ float wt[kMoeMaxK];
  const int64_t t = blockIdx.x;
  stage_choices(row_of, w, t, k, rows, r, wt);
  for (int64_t c = int64_t(threadIdx.x) * N; c < h; c += int64_t(blockDim.x) * N) {
    float acc[N];
#pragma unroll
    for (int q = 0; q < N; ++q) acc[q] = 0.f;
    for (int j = 0; j < k; ++j) {
      if (r[j] < 0) continue;
      float v[N];
      load_vec<N>(ys + int64_t(r[j]) * h + c, v);
#pragma unroll
      for (int q = 0; q < N; ++q) acc[q] = __fadd_rn(acc[q], __fmul_rn(wt[j], v[q]));
    }
    store_vec<N>(y + t * h + c, acc);
  }
}

// Grid T blocks: for each j, dys[r_tj, :] = w_tj dy[t, :] and dw[t, j] = <ys[r_tj, :], dy[t, :]>
// (a block reduction).
template <class T, int N>
__global__ void __launch_bounds__(kCombineThreads)
    combine_backward_kernel(const T* ys, const int32_t* row_of, const float* w, const T* dy, T* dys, float* dw,
                            int64_t rows, int k, int64_t h) {
  __shared__ int r[kMoeMaxK];
  __shared__ float wt[kMoeMaxK];
  const int64_t t = blockIdx.x;
  stage_choices(row_of, w, t, k, rows, r, wt);
  for (int j = 0; j < k; ++j) {
    const int row = r[j];  // the same for the whole block: every thread reaches block_sum
    float dot = 0.f;
    if (row >= 0)
      for (int64_t c = int64_t(threadIdx.x) * N; c < h; c += int64_t(blockDim.x) * N) {
        float g[N], v[N], out[N];
        load_vec<N>(dy + t * h + c, g);
        load_vec<N>(ys + int64_t(row) * h + c, v);
#pragma unroll
        for (int q = 0; q < N; ++q) {
          dot += v[q] * g[q];
          out[q] = __fmul_rn(wt[j], g[q]);
        }
        store_vec<N>(dys + int64_t(row) * h + c, out);
      }
    dot = block_sum(dot);
    if (threadIdx.x == 0) dw[t * k + j] = row >= 0 ? dot : 0.f;
  }
}

void check_combine_shape(const char* op, int64_t tokens, int64_t k, int64_t h) {
  LOOM_CHECK(tokens >= 0 && tokens <= 0x7fffffffLL && k >= 1 && k <= kMoeMaxK && h >= 1 && tokens * k <= 0x7fffffffLL,
             op, ": tokens ", tokens, ", top ", k, " (at most ", kMoeMaxK, "), hidden ", h);
}

}  // namespace

size_t moe_dispatch_workspace_bytes(int64_t assignments, int64_t experts) {
  return static_cast<size_t>(dispatch_chunks(assignments) * experts) * sizeof(int);
}

void moe_dispatch(const int32_t* ids, int64_t assignments, int64_t k, int64_t experts, int32_t* token_of_row,
                  int32_t* row_of, int64_t* offsets, void* workspace, Stream s) {
  LOOM_CHECK(assignments >= 0 && assignments <= 0x7fffffffLL && k >= 1 && assignments % k == 0 && experts >= 1 &&
                 experts <= kMoeMaxExperts,
             "cuda::moe_dispatch: ", assignments, " assignments, top ", k, ", ", experts, " experts (at most ",
             kMoeMaxExperts, ")");
  int* chunk_counts = static_cast<int*>(workspace);
  const int64_t chunks = dispatch_chunks(assignments);
  const unsigned blocks = static_cast<unsigned>((chunks + kDispatchWarps - 1) / kDispatchWarps);
  const size_t shared = sizeof(int) * kDispatchWarps * experts;
  const int e = static_cast<int>(experts);
  if (chunks > 0) {
    dispatch_count_kernel<<<blocks, kDispatchWarps * 32, shared, s>>>(ids, assignments, e, chunks, chunk_counts);
    LOOM_CUDA_LAUNCH_CHECK();
  }
  dispatch_scan_kernel<<<1, kMoeMaxExperts, 0, s>>>(chunk_counts, chunks, e, offsets);
  LOOM_CUDA_LAUNCH_CHECK();
  if (chunks > 0) {
    dispatch_scatter_kernel<<<blocks, kDispatchWarps * 32, shared, s>>>(
        ids, assignments, static_cast<int>(k), e, chunks, chunk_counts, offsets, token_of_row, row_of);
    LOOM_CUDA_LAUNCH_CHECK();
  }
}

template <class T>
void moe_combine_forward(const T* ys, const int32_t* row_of, const float* w, T* y, int64_t tokens, int64_t k,
                         int64_t h, Stream s) {
  check_combine_shape("cuda::moe_combine_forward", tokens, k, h);
  if (tokens == 0) return;
  constexpr int kN = kVecN<T>;
  const auto grid = static_cast<unsigned>(tokens);
  if (h % kN == 0 && aligned16(ys) && aligned16(y))
    combine_forward_kernel<T, kN><<<grid, kCombineThreads, 0, s>>>(ys, row_of, w, y, tokens * k, int(k), h);
  else
    combine_forward_kernel<T, 1><<<grid, kCombineThreads, 0, s>>>(ys, row_of, w, y, tokens * k, int(k), h);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <class T>
void moe_combine_backward(const T* ys, const int32_t* row_of, const float* w, const T* dy, T* dys, float* dw,
                          int64_t tokens, int64_t k, int64_t h, Stream s) {
  check_combine_shape("cuda::moe_combine_backward", tokens, k, h);
  if (tokens == 0) return;
  constexpr int kN = kVecN<T>;
  const auto grid = static_cast<unsigned>(tokens);
  if (h % kN == 0 && aligned16(ys) && aligned16(dy) && aligned16(dys))
    combine_backward_kernel<T, kN><<<grid, kCombineThreads, 0, s>>>(ys, row_of, w, dy, dys, dw, tokens * k, int(k), h);
  else
    combine_backward_kernel<T, 1><<<grid, kCombineThreads, 0, s>>>(ys, row_of, w, dy, dys, dw, tokens * k, int(k), h);
  LOOM_CUDA_LAUNCH_CHECK();
}

#define LOOM_INST(T)                                                                                               \
  template void moe_combine_forward<T>(const T*, const int32_t*, const float*, T*, int64_t, int64_t, int64_t,      \
                                       Stream);                                                                    \
  template void moe_combine_backward<T>(const T*, const int32_t*, const float*, const T*, T*, float*, int64_t,     \
                                        int64_t, int64_t, Stream);
LOOM_INST(float)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cuda
