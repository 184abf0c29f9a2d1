// CUDA strided copies for kernels/elementwise.h (copy_strided with cast, copy_strided_bytes): the
// layout is first simplified (size-1 dims dropped, mergeable dims merged), then one of four paths:
// contiguous (memcpy or a 16-byte vectorized cast), a 32x32 shared-memory tiled transpose for
// (batched) 2-D transposes, 16-byte packs along a contiguous innermost dim, or a scalar gather.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/elementwise.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 4;

// Element conversion: a plain copy for the same type, through f32 otherwise (float <-> bf16).
template <class D, class S>
__device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same_v<S, D>) {
    return v;
  } else {
    D d;
    store(&d, load(&v));
    return d;
  }
}

// The same view with size-1 dims dropped and dims merged where the outer stride equals
// inner stride * inner size. Row-major order over the shape is unchanged, so the destination
// index of every element is too. ndim 0 means a single element.
StridedLayout simplify(const StridedLayout& l) {
  StridedLayout c;
  for (int d = 0; d < l.ndim; ++d) {
    if (l.shape[d] == 1) continue;
    if (c.ndim > 0 && c.strides[c.ndim - 1] == l.strides[d] * l.shape[d]) {
      c.shape[c.ndim - 1] *= l.shape[d];
      c.strides[c.ndim - 1] = l.strides[d];
    } else {
      c.shape[c.ndim] = l.shape[d];
      c.strides[c.ndim] = l.strides[d];
      ++c.ndim;
    }
  }
  return c;
}

// dst[i] = D(src[i]) for S != D in packs of N (16 bytes of the narrower type; the wider side moves
// as two 16-byte accesses), the n % N tail by the first threads.
template <class S, class D, int N>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) cast_kernel(const S* src, D* dst, int64_t n) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t packs = n / N;
  int64_t p = tid;
  for (; p + stride < packs; p += 2 * stride) {
    float v0[N], v1[N];
    load_vec<N>(src + p * N, v0);
    load_vec<N>(src + (p + stride) * N, v1);
    store_vec<N>(dst + p * N, v0);
    store_vec<N>(dst + (p + stride) * N, v1);
  }
  if (p < packs) {
    float v[N];
    load_vec<N>(src + p * N, v);
    store_vec<N>(dst + p * N, v);
  }
  const int64_t i = packs * N + tid;
  if (N > 1 && i < n) store(dst + i, load(src + i));
}

// Batched transpose: dst[b, i, j] (contiguous [batch, d0, d1]) = src[b * sb + i + j * s1], i.e.
// the source is contiguous along i. A 32x32 tile is read along i (coalesced in src), staged in
// shared memory (+1 column against bank conflicts), and written along j (coalesced in dst).
// Block 32 x 8; each thread moves 4 elements per tile. Tile rows / batches beyond the grid's
// 65535 limit are covered by grid-stride loops (uniform per block, so __syncthreads is safe).
constexpr int kTile = 32, kTileRows = 8;

template <class S, class D>
__global__ void transpose_kernel(const S* src, D* dst, int64_t batch, int64_t d0, int64_t d1, int64_t sb,
                                 int64_t s1) {
  __shared__ S tile[kTile][kTile + 1];  // tile[j - j0][i - i0]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tiles0 = (d0 + kTile - 1) / kTile;
  const int64_t j0 = int64_t(blockIdx.x) * kTile;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    const S* sbat = src + b * sb;
    D* dbat = dst + b * d0 * d1;
    for (int64_t t0 = blockIdx.y; t0 < tiles0; t0 += gridDim.y) {
      const int64_t i0 = t0 * kTile;
#pragma unroll
      for (int k = 0; k < kTile; k += kTileRows) {
        const int64_t i = i0 + tx, j = j0 + ty + k;
        if (i < d0 && j < d1) tile[ty + k][tx] = sbat[i + j * s1];
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kTile; k += kTileRows) {
        const int64_t i = i0 + ty + k, j = j0 + tx;
        if (i < d0 && j < d1) dbat[i * d1 + j] = convert<D>(tile[tx][ty + k]);
      }
      __syncthreads();
    }
  }
}

// Innermost dim contiguous (stride 1, size % N == 0, every other stride % N == 0, both pointers
// 16-byte aligned): N consecutive elements share one offset computation and move as 16-byte
// accesses (N is 16 bytes of the narrower type).
template <class S, class D, int N>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    copy_inner_kernel(const S* src, StridedLayout l, D* dst, int64_t numel) {
  const int64_t packs = numel / N;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t off = strided_offset(p * N, l);
    if constexpr (std::is_same_v<S, D>) {
      *reinterpret_cast<Vec<D, N>*>(dst + p * N) = *reinterpret_cast<const Vec<S, N>*>(src + off);
    } else {
      float v[N];
      load_vec<N>(src + off, v);
      store_vec<N>(dst + p * N, v);
    }
  }
}

template <class S, class D>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    copy_generic_kernel(const S* src, StridedLayout l, D* dst, int64_t numel) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = convert<D>(src[strided_offset(i, l)]);
}

template <class S, class D>
void launch_copy(const S* src, const StridedLayout& layout, D* dst, Stream s) {
  int64_t numel = 1;
  for (int d = 0; d < layout.ndim; ++d) {
    LOOM_CHECK(layout.shape[d] >= 0, "copy_strided: negative extent ", layout.shape[d], " in dim ", d);
    numel *= layout.shape[d];
  }
  if (numel == 0) return;
  const StridedLayout l = simplify(layout);
  constexpr int kN = sizeof(S) < sizeof(D) ? kVecN<S> : kVecN<D>;
  const bool aligned = aligned16(src) && aligned16(dst);

  // Contiguous: a byte copy for the same type, a vectorized cast otherwise.
  if (l.ndim == 0 || (l.ndim == 1 && l.strides[0] == 1)) {
    if constexpr (std::is_same_v<S, D>) {
      if (static_cast<const void*>(dst) == static_cast<const void*>(src)) return;  // a copy onto itself
      LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(numel) * sizeof(S), cudaMemcpyDeviceToDevice, s));
    } else if (aligned) {
      cast_kernel<S, D, kN><<<grid_for(numel / kN, kThreads, kBlocksPerSm), kThreads, 0, s>>>(src, dst, numel);
    } else {
      cast_kernel<S, D, 1><<<grid_for(numel, kThreads, kBlocksPerSm), kThreads, 0, s>>>(src, dst, numel);
    }
    LOOM_CUDA_LAUNCH_CHECK();
    return;
  }

  // (Batched) 2-D transpose: [d0, d1] with strides {1, s1}, or [batch, d0, d1] with {sb, 1, s1}.
  const int nd = l.ndim;
  if ((nd == 2 || nd == 3) && l.strides[nd - 2] == 1 && l.strides[nd - 1] != 1 && l.shape[nd - 2] >= 8 &&
      l.shape[nd - 1] >= 8) {
    const int64_t batch = nd == 3 ? l.shape[0] : 1, sb = nd == 3 ? l.strides[0] : 0;
    const int64_t d0 = l.shape[nd - 2], d1 = l.shape[nd - 1], s1 = l.strides[nd - 1];
    const int64_t gx = (d1 + kTile - 1) / kTile, gy = (d0 + kTile - 1) / kTile;
    LOOM_CHECK(gx <= 0x7fffffffLL, "copy_strided: transpose of ", d1, " columns is too wide");
    const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy < 65535 ? gy : 65535),
                    static_cast<unsigned>(batch < 65535 ? batch : 65535));
    transpose_kernel<S, D><<<grid, dim3(kTile, kTileRows), 0, s>>>(src, dst, batch, d0, d1, sb, s1);
    LOOM_CUDA_LAUNCH_CHECK();
    return;
  }

  // Contiguous innermost dim in 16-byte packs.
  bool inner = aligned && nd >= 2 && l.strides[nd - 1] == 1 && l.shape[nd - 1] % kN == 0;
  for (int d = 0; d < nd - 1 && inner; ++d) inner = l.strides[d] % kN == 0;
  if (inner) {
    copy_inner_kernel<S, D, kN><<<grid_for(numel / kN, kThreads, kBlocksPerSm), kThreads, 0, s>>>(src, l, dst, numel);
  } else {
    copy_generic_kernel<S, D><<<grid_for(numel, kThreads, kBlocksPerSm), kThreads, 0, s>>>(src, l, dst, numel);
  }
  LOOM_CUDA_LAUNCH_CHECK();
}

// Row blockIdx.y (+ gridDim.y ...), units blockIdx.x * kThreads + threadIdx.x (+ gridDim.x * kThreads ...):
// unit u of row r at r * pitch + u * sizeof(W); no division per element.
template <class W>
__global__ void __launch_bounds__(kThreads) copy_2d_kernel(const char* src, int64_t src_pitch, char* dst,
                                                         int64_t dst_pitch, int64_t units, int64_t rows) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const W* s = reinterpret_cast<const W*>(src + r * src_pitch);
    W* d = reinterpret_cast<W*>(dst + r * dst_pitch);
    for (int64_t u = int64_t(blockIdx.x) * kThreads + threadIdx.x; u < units; u += int64_t(gridDim.x) * kThreads)
      d[u] = s[u];
  }
}

template <class W>
void launch_copy_2d(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes, int64_t rows,
                    Stream s) {
  const int64_t units = row_bytes / int64_t(sizeof(W));
  const dim3 grid(unsigned(std::min<int64_t>((units + kThreads - 1) / kThreads, 1024)),
                  unsigned(std::min<int64_t>(rows, 65535)));
  copy_2d_kernel<W><<<grid, kThreads, 0, s>>>(static_cast<const char*>(src), src_pitch, static_cast<char*>(dst),
                                             dst_pitch, units, rows);
}

}  // namespace

void copy_2d(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes, int64_t rows,
             Stream s) {
  LOOM_CHECK(row_bytes >= 0 && rows >= 0 && src_pitch >= row_bytes && dst_pitch >= row_bytes, "copy_2d: ", rows,
             " rows of ", row_bytes, " bytes, pitches ", src_pitch, " and ", dst_pitch);
  if (rows == 0 || row_bytes == 0) return;
  const auto all = [&](int64_t a) {
    return (reinterpret_cast<uintptr_t>(src) % a) == 0 && (reinterpret_cast<uintptr_t>(dst) % a) == 0 &&
           src_pitch % a == 0 && dst_pitch % a == 0 && row_bytes % a == 0;
  };
  if (all(16)) launch_copy_2d<int4>(src, src_pitch, dst, dst_pitch, row_bytes, rows, s);
  else if (all(8)) launch_copy_2d<int2>(src, src_pitch, dst, dst_pitch, row_bytes, rows, s);
  else if (all(4)) launch_copy_2d<int>(src, src_pitch, dst, dst_pitch, row_bytes, rows, s);
  else if (all(2)) launch_copy_2d<short>(src, src_pitch, dst, dst_pitch, row_bytes, rows, s);
  else launch_copy_2d<char>(src, src_pitch, dst, dst_pitch, row_bytes, rows, s);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <class S, class D>
void copy_strided(const S* src, const StridedLayout& l, D* dst, Stream s) {
  launch_copy(src, l, dst, s);
}

void copy_strided_bytes(const void* src, const StridedLayout& l, void* dst, int elem_size, Stream s) {
  switch (elem_size) {
    case 1: launch_copy(static_cast<const uint8_t*>(src), l, static_cast<uint8_t*>(dst), s); break;
    case 2: launch_copy(static_cast<const uint16_t*>(src), l, static_cast<uint16_t*>(dst), s); break;
    case 4: launch_copy(static_cast<const uint32_t*>(src), l, static_cast<uint32_t*>(dst), s); break;
    case 8: launch_copy(static_cast<const uint64_t*>(src), l, static_cast<uint64_t*>(dst), s); break;
    default: LOOM_CHECK(false, "copy_strided_bytes: unsupported element size ", elem_size);
  }
}

template void copy_strided<float, float>(const float*, const StridedLayout&, float*, Stream);
template void copy_strided<float, bf16>(const float*, const StridedLayout&, bf16*, Stream);
template void copy_strided<bf16, float>(const bf16*, const StridedLayout&, float*, Stream);
template void copy_strided<bf16, bf16>(const bf16*, const StridedLayout&, bf16*, Stream);

}  // namespace loom::cuda
