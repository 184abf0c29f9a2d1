// CUDA path of kernels/linear_cross_entropy.h: per chunk of rows, cuBLASLt logits (T in, f32
// accumulation, written in T: bf16 logits for bf16 inputs), one block per row for log-sum-exp, loss
// and dlogits (written in place over the logits), then the dh and dW GEMMs. The row scale 1/count is
// counted on the device; the loss sum is deterministic.
#include <cooperative_groups.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/softmax_common.cuh"
#include "kernels/linear_cross_entropy.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
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

// The row pass with one read of the logits: a cluster of C blocks per row, block `rank` keeping its
// slice [rank slice, (rank + 1) slice) of the row in shared memory between the log-sum-exp (read
// from global memory once) and the gradient (computed from shared memory). The blocks' (max, sum)
// pairs are merged through distributed shared memory in rank order, so every block of a row gets the
// same log-sum-exp and the result does not depend on timing. row_kernel reads each row twice, and a
// 256 KB row (Llama 3's 128,256 bf16 logits) is long gone from L2 by its second read. The clusters
// are persistent (as many as are resident, each looping over rows): a cluster a row, launched and
// retired 2,048 times a chunk, left the GPU waiting for 8 free slots in a GPC (824 us a 1B chunk
// against row_kernel's 589 on an H100). 16-byte vectors (V = 8 bf16, 4 f32), kUnroll in flight.
template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    row_cluster_kernel(T* logits, int64_t rows, const int32_t* targets, float* row_loss, const float* row_scale,
                       int64_t vocab, float softcap, int32_t ignore_index, int64_t slice) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(sizeof(T) * V == 16, "16-byte vectors");
  constexpr int kUnroll = 4;
  extern __shared__ __align__(16) unsigned char row_smem[];
  Vec<T, V>* keep = reinterpret_cast<Vec<T, V>*>(row_smem);
  __shared__ float2 block_ml;  // this block's (max, sum) of the current row, read by the cluster
  __shared__ float warp_m[kThreads / 32], warp_l[kThreads / 32], shared_lse;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), blocks = cluster.num_blocks();
  const int lane = int(threadIdx.x) & 31;
  const int64_t begin = int64_t(rank) * slice, end = min(vocab, begin + slice);
  const int64_t count = end > begin ? (end - begin) / V : 0;  // vectors of this block's slice
  const int64_t clusters = gridDim.x / blocks;
  const float scale = *row_scale;
  for (int64_t r = blockIdx.x / blocks; r < rows; r += clusters) {
    const Vec<T, V>* src = reinterpret_cast<const Vec<T, V>*>(logits + r * vocab + begin);
    Vec<T, V>* dst = reinterpret_cast<Vec<T, V>*>(logits + r * vocab + begin);
    const int32_t t = targets[r];
    if (!counts(t, vocab, ignore_index)) {  // the same for every block of the cluster: no cluster barrier
      Vec<T, V> z;
#pragma unroll
      for (int k = 0; k < V; ++k) store(&z.v[k], 0.f);
      for (int64_t i = threadIdx.x; i < count; i += kThreads) dst[i] = z;
      if (rank == 0 && threadIdx.x == 0) row_loss[r] = 0.f;
      continue;
    }
    float m = -INFINITY, l = 0.f;
    for (int64_t i0 = threadIdx.x; i0 < count; i0 += int64_t(kThreads) * kUnroll) {
      Vec<T, V> v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (i0 + u * kThreads < count) v[u] = src[i0 + u * kThreads];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (i0 + u * kThreads < count) {
          keep[i0 + u * kThreads] = v[u];
#pragma unroll
          for (int k = 0; k < V; ++k) online_add(m, l, capped(load(&v[u].v[k]), softcap));
        }
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
      merge(m, l, m2, l2);
    }
    if (lane == 0) {
      warp_m[threadIdx.x >> 5] = m;
      warp_l[threadIdx.x >> 5] = l;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      m = warp_m[0];
      l = warp_l[0];
      for (int w = 1; w < kThreads / 32; ++w) merge(m, l, warp_m[w], warp_l[w]);
      block_ml = make_float2(m, l);
    }
    cluster.sync();  // every block's pair (and this block's kept slice) visible
    if (threadIdx.x < 32) {  // lane b reads block b's pair; lane 0 merges them in rank order
      const float2 p = unsigned(lane) < blocks ? *cluster.map_shared_rank(&block_ml, unsigned(lane))
                                               : make_float2(-INFINITY, 0.f);
      for (unsigned b = 0; b < blocks; ++b) {
        const float mb = __shfl_sync(0xffffffffu, p.x, int(b)), lb = __shfl_sync(0xffffffffu, p.y, int(b));
        if (b == 0) {
          m = mb, l = lb;
        } else {
          merge(m, l, mb, lb);
        }
      }
      if (lane == 0) shared_lse = l == 0.f ? m : m + logf(l);  // a NaN l (a NaN logit) stays NaN
    }
    // Arrive now, wait at the row's end: no block overwrites its pair (next row) or leaves while
    // another may still read it.
    asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
    __syncthreads();
    const float lse = shared_lse;
    for (int64_t i = threadIdx.x; i < count; i += kThreads) {
      const Vec<T, V> x = keep[i];
      const int64_t v0 = begin + i * V;
      Vec<T, V> g;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        float z = load(&x.v[k]), dz = 1.f;
        if (softcap > 0.f) {
          const float th = tanhf(z / softcap);
          z = softcap * th;
          dz = 1.f - th * th;
        }
        const bool hit = v0 + k == t;
        if (hit) row_loss[r] = lse - z;
        store(&g.v[k], (expf(z - lse) - (hit ? 1.f : 0.f)) * dz * scale);
      }
      dst[i] = g;
    }
    asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");  // also: keep's reads done before the next row's writes
  }
#else
  __trap();  // built without sm_90: launch_rows never launches it then (flash::sm90_ready())
#endif
}

// The cluster size of row_cluster_kernel for a row of `row_bytes`: the fewest blocks (1 to 8, the
// portable cluster limit) whose slices are at most kSliceBytes (several blocks an SM, many loads in
// flight), else 8 blocks while a slice fits kMaxSliceBytes; 0 when it does not (row_kernel then).
constexpr int64_t kSliceBytes = 32 << 10, kMaxSliceBytes = 160 << 10;
int cluster_blocks(int64_t row_bytes) {
  for (int c = 1; c <= 8; c *= 2)
    if ((row_bytes + c - 1) / c <= kSliceBytes) return c;
  return (row_bytes + 7) / 8 + 16 <= kMaxSliceBytes ? 8 : 0;
}

// Launches row_cluster_kernel with as many clusters of c blocks as are resident at once (asked once
// for each device, kernel, c and slice size); false when none fits (the caller runs row_kernel).
template <class T>
bool launch_cluster_rows(T* logits, int64_t rows, const int32_t* targets, float* row_loss, const float* row_scale,
                         int64_t vocab, float softcap, int32_t ignore_index, int c, Stream s) {
  constexpr int V = 16 / sizeof(T);
  const int64_t slice = ((vocab + c - 1) / c + V - 1) / V * V;
  auto* kernel = row_cluster_kernel<T, V>;
  allow_dynamic_smem<row_cluster_kernel<T, V>>(size_t(kMaxSliceBytes));
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(c), attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(slice) * sizeof(T);
  cfg.stream = s;
  cfg.attrs = attr, cfg.numAttrs = 1;
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::map<std::tuple<int, int, int64_t>, int> resident_clusters;
  int resident = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_tuple(device, c, slice);
    if (auto it = resident_clusters.find(key); it != resident_clusters.end()) {
      resident = it->second;
    } else {
      cfg.gridDim = dim3(unsigned(c * sm_count()));
      LOOM_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&resident, kernel, &cfg));
      resident_clusters.emplace(key, resident);
    }
  }
  if (resident < 1) return false;
  cfg.gridDim = dim3(unsigned(std::min<int64_t>(rows, resident) * c));
  LOOM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, logits, rows, targets, row_loss, row_scale, vocab, softcap,
                                     ignore_index, slice));
  return true;
}

// One row pass over `rows` rows of logits: the cluster kernel where the device has clusters and the
// row is whole 16-byte vectors, else row_kernel with the widest vector the row length allows
// (16-byte loads; rows start 256-byte aligned plus a multiple of vocab elements).
template <class T>
void launch_rows(T* logits, int64_t rows, const int32_t* targets, float* row_loss, const float* row_scale,
                 int64_t vocab, float softcap, int32_t ignore_index, Stream s) {
  if (rows == 0) return;
  if (const int c = cluster_blocks(vocab * int64_t(sizeof(T)));
      c > 0 && vocab % (16 / int64_t(sizeof(T))) == 0 && flash::sm90_ready() &&
      launch_cluster_rows<T>(logits, rows, targets, row_loss, row_scale, vocab, softcap, ignore_index, c, s))
    return;
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
