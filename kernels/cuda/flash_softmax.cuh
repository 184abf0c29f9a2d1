// The softmax pieces of the Hopper flash-attention kernels, on wgmma m64nN accumulator fragments
// (a thread holds rows row0 and row0 + 8 of its warp's 16, columns 8 n + col0 + {0, 1}, element
// 4 n + 2 r + {0, 1} for row r; kernels/cuda/wgmma.cuh). Forward: the online softmax of a tile of
// S (raw dot products; m in the same units, l a partial row sum), O's rescale and the epilogue.
// Backward: P and dS recomputed from the saved log-sum-exp and D. FlashAttention-3's softmax.h
// in Loom's terms.
#pragma once
#include <cmath>

#include "kernels/attention.h"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/flash_mask.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace loom::cuda::flash::sm90 {

// How far (log2 units) a row's running maximum may trail its true maximum: P and l are then up to
// 2^8 times their usual size, far inside f32's and bf16's range.
inline constexpr float kLazyRescale = 8.f;

// Online softmax of one tile of S, in place: S becomes exp2((S - m) scale_log2) with m the row's kept
// maximum (at most kLazyRescale below its true one); l and m are updated and corr receives each row's
// rescale factor for O (1 when m stayed, 0 while nothing was visible).
template <int kNs>
__device__ __forceinline__ void online_softmax(float (&sacc)[4 * kNs], float (&m)[2], float (&l)[2], float (&corr)[2],
                                               float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < kNs; ++n) mx = nan_fmaxf(mx, nan_fmaxf(sacc[4 * n + 2 * r], sacc[4 * n + 2 * r + 1]));
    mx = nan_fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // a NaN score makes the row NaN
    mx = nan_fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // The row keeps its maximum unless the tile's exceeds it by more than kLazyRescale (log2
    // units): exponentials up to 2^kLazyRescale are exact enough in f32 and bf16, and O is rescaled
    // only when a row's maximum moves (FlashAttention-4's conditional rescale). A NaN or a first
    // visible score (m = -inf) always moves it.
    const float mn = nan_fmaxf(m[r], mx);
    const bool moves = !((mn - m[r]) * scale_log2 <= kLazyRescale);
    const float mk = moves ? mn : m[r];
    const float mu = mk == -INFINITY ? 0.f : mk;
    corr[r] = moves ? fast_exp2((m[r] - mu) * scale_log2) : 1.f;
    const float nb = -mu * scale_log2;
    m[r] = mk;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < kNs; ++n) {
      sacc[4 * n + 2 * r] = fast_exp2(fmaf(sacc[4 * n + 2 * r], scale_log2, nb));
      sacc[4 * n + 2 * r + 1] = fast_exp2(fmaf(sacc[4 * n + 2 * r + 1], scale_log2, nb));
      sum += sacc[4 * n + 2 * r] + sacc[4 * n + 2 * r + 1];
    }
    l[r] = l[r] * corr[r] + sum;
  }
}

// P as bf16 A fragments for O += P V (register-sourced wgmma, 16 keys per k-step).
template <int kNs>
__device__ __forceinline__ void pack_p(uint32_t (&pf)[kNs / 2][4], const float (&sacc)[4 * kNs]) {
#pragma unroll
  for (int kk = 0; kk < kNs / 2; ++kk) {
    pf[kk][0] = pack_bf16(sacc[8 * kk + 0], sacc[8 * kk + 1]);
    pf[kk][1] = pack_bf16(sacc[8 * kk + 2], sacc[8 * kk + 3]);
    pf[kk][2] = pack_bf16(sacc[8 * kk + 4], sacc[8 * kk + 5]);
    pf[kk][3] = pack_bf16(sacc[8 * kk + 6], sacc[8 * kk + 7]);
  }
}

// O *= corr per row. Rows whose kept maximum did not move (online_softmax moves it only when a tile's
// exceeds it by more than kLazyRescale) have corr == 1 exactly, so after a row's first tiles the
// warp almost always skips the rescale: none of its rows needs it.
template <int kNo>
__device__ __forceinline__ void rescale_o(float (&oacc)[4 * kNo], const float (&corr)[2]) {
  if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
    for (int n = 0; n < kNo; ++n) {
      oacc[4 * n + 0] *= corr[0];
      oacc[4 * n + 1] *= corr[0];
      oacc[4 * n + 2] *= corr[1];
      oacc[4 * n + 3] *= corr[1];
    }
  }
}

// The epilogue's per-row pieces: a row's sum over the quad of threads holding it (l is each one's
// partial sum) and its lse = ln(sum exp(z)) (-inf where nothing was visible; m in S's units).
__device__ __forceinline__ float quad_sum(float l) {
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  return l + __shfl_xor_sync(0xffffffffu, l, 2);
}
__device__ __forceinline__ float row_lse(const AttentionParams& p, float m, float sum) {
  return sum == 0.f ? -INFINITY : m * p.scale + logf(sum);
}

// Row sums across the quad, then out = O / l and lse = ln(sum exp(z)) for this thread's two rows
// (query rows row0 and row0 + 8 of head h, batch row b; rows past seq are not written).
template <int kNo>
__device__ __forceinline__ void store_rows(const AttentionParams& p, const float (&oacc)[4 * kNo], const float (&m)[2],
                                           const float (&l)[2], int64_t b, int64_t h, int64_t row0, int col0, int lane,
                                           bf16* __restrict__ out, float* __restrict__ lse) {
  const int64_t q_stride = p.heads * p.head_dim;
  const int hd = int(p.head_dim);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(l[r]);
    const float inv = sum == 0.f ? 0.f : 1.f / sum;  // a NaN sum stays NaN
    const int64_t i = row0 + 8 * r;
    if (i >= p.seq) continue;
    bf16* orow = out + (b * p.seq + i) * q_stride + h * p.head_dim;
#pragma unroll
    for (int n = 0; n < kNo; ++n) {
      const int col = n * 8 + col0;
      if (col < hd)
        *reinterpret_cast<__nv_bfloat162*>(orow + col) =
            __floats2bfloat162_rn(oacc[4 * n + 2 * r] * inv, oacc[4 * n + 2 * r + 1] * inv);
    }
    if ((lane & 3) == 0) lse[(b * p.heads + h) * p.seq + i] = row_lse(p, m[r], sum);
  }
}

// store_rows with 16-byte stores: within each group of four 8-column fragments the quad's threads
// trade their bf16 pairs (a 4 x 4 transpose in two butterfly steps, four shuffles), so thread q of
// the quad writes fragment 4 g + q's 8 columns at once and a warp's store covers 8 rows of 64
// contiguous bytes, whole 32-byte sectors (store_rows' 4-byte stores fill half of each). kNo a
// multiple of 4; out 16-byte aligned and head_dim a multiple of 8 (sm90_ws_supported).
template <int kNo>
__device__ __forceinline__ void store_rows_wide(const AttentionParams& p, const float (&oacc)[4 * kNo],
                                                const float (&m)[2], const float (&l)[2], int64_t b, int64_t h,
                                                int64_t row0, int lane, bf16* __restrict__ out,
                                                float* __restrict__ lse) {
  static_assert(kNo % 4 == 0, "groups of four fragments");
  const int64_t q_stride = p.heads * p.head_dim;
  const int hd = int(p.head_dim), q = lane & 3;
  const bool odd = q & 1, high = q & 2;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(l[r]);
    const float inv = sum == 0.f ? 0.f : 1.f / sum;  // a NaN sum stays NaN
    const int64_t i = row0 + 8 * r;
    bf16* orow = out + (b * p.seq + (i < p.seq ? i : 0)) * q_stride + h * p.head_dim;
#pragma unroll
    for (int g = 0; g < kNo / 4; ++g) {
      uint32_t w[4], a[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(oacc[4 * (4 * g + j) + 2 * r] * inv,
                                                       oacc[4 * (4 * g + j) + 2 * r + 1] * inv);
        w[j] = *reinterpret_cast<const uint32_t*>(&v);
      }
      // Step 1 (partner q ^ 1): slot 2 m + e holds thread (q & ~1) + e's word 2 m + (q & 1).
#pragma unroll
      for (int mm = 0; mm < 2; ++mm) {
        const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? w[2 * mm] : w[2 * mm + 1], 1);
        a[2 * mm] = odd ? got : w[2 * mm];
        a[2 * mm + 1] = odd ? w[2 * mm + 1] : got;
      }
      // Step 2 (partner q ^ 2): slot s holds thread s's word q, columns 8 (4 g + q) + 2 s and + 1.
      const uint32_t g0 = __shfl_xor_sync(0xffffffffu, high ? a[0] : a[2], 2);
      const uint32_t g1 = __shfl_xor_sync(0xffffffffu, high ? a[1] : a[3], 2);
      const uint4 x = high ? make_uint4(g0, g1, a[2], a[3]) : make_uint4(a[0], a[1], g0, g1);
      const int col = 8 * (4 * g + q);
      if (i < p.seq && col < hd) *reinterpret_cast<uint4*>(orow + col) = x;
    }
    if (q == 0 && i < p.seq) lse[(b * p.heads + h) * p.seq + i] = row_lse(p, m[r], sum);
  }
}

// store_rows into shared memory: out = O / l as bf16 at rows tile_row0 and tile_row0 + 8 of a
// 128-byte-swizzled kRows-row tile (wgmma::sw128, columns 8 n + col0 + {0, 1}; a TMA store then
// writes the tile, leaving out rows past seq and columns past head_dim), lse as store_rows writes it.
template <int kNo, int kRows>
__device__ __forceinline__ void store_rows_tile(const AttentionParams& p, const float (&oacc)[4 * kNo],
                                                const float (&m)[2], const float (&l)[2], int64_t b, int64_t h,
                                                int64_t row0, int tile_row0, int col0, int lane, bf16* tile,
                                                float* __restrict__ lse) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(l[r]);
    const float inv = sum == 0.f ? 0.f : 1.f / sum;  // a NaN sum stays NaN
#pragma unroll
    for (int n = 0; n < kNo; ++n)
      *reinterpret_cast<__nv_bfloat162*>(tile + wgmma::sw128<kRows>(tile_row0 + 8 * r, n * 8 + col0)) =
          __floats2bfloat162_rn(oacc[4 * n + 2 * r] * inv, oacc[4 * n + 2 * r + 1] * inv);
    const int64_t i = row0 + 8 * r;
    if ((lane & 3) == 0 && i >= 0 && i < p.seq) lse[(b * p.heads + h) * p.seq + i] = row_lse(p, m[r], sum);
  }
}

// Backward, in place over a kN-column fragment of S^T (rows keys, columns queries): S^T becomes
// P^T = exp(S^T scale - lse) where the fragment's bit is set, else 0, and dP^T becomes dS^T =
// P^T (dP^T - D) dcap (soft-cap's derivative; 1 without). Column c's lse and D are lse[c], dsum[c].
template <int kN>
__device__ __forceinline__ void bwd_scores(float (&st)[kN / 2], float (&dpt)[kN / 2], const uint32_t (&bits)[2],
                                           const float* lse, const float* dsum, int col0, float scale,
                                           float softcap, float scale_log2) {
#pragma unroll
  for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int il = n * 8 + col0 + c;
      const float lse2 = lse[il] * kLog2e, dsv = dsum[il];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int e = 2 * r + c;
        float dcap = 1.f;
        const float s = cap_dot(st[4 * n + e], scale, softcap, &dcap);
        const float pv = fragment_bit(bits, n, e) ? fast_exp2(fmaf(s, scale_log2, -lse2)) : 0.f;
        st[4 * n + e] = pv;
        dpt[4 * n + e] = pv * (dpt[4 * n + e] - dsv) * dcap;
      }
    }
  }
}

// Packed A fragments (pack_p's layout) into a 128-byte-swizzled tile of kRows rows (wgmma::sw128)
// at rows row0, row0 + 8 and columns c0 + 16 kk + col0 (+ 1; x = 0, 1) and + 8 (x = 2, 3): the
// tile then holds the fragment's matrix for a shared-memory operand.
template <int kRows, int kK>
__device__ __forceinline__ void store_a(bf16* tile, const uint32_t (&a)[kK][4], int row0, int c0, int col0) {
#pragma unroll
  for (int kk = 0; kk < kK; ++kk) {
    *reinterpret_cast<uint32_t*>(tile + wgmma::sw128<kRows>(row0, c0 + 16 * kk + col0)) = a[kk][0];
    *reinterpret_cast<uint32_t*>(tile + wgmma::sw128<kRows>(row0 + 8, c0 + 16 * kk + col0)) = a[kk][1];
    *reinterpret_cast<uint32_t*>(tile + wgmma::sw128<kRows>(row0, c0 + 16 * kk + 8 + col0)) = a[kk][2];
    *reinterpret_cast<uint32_t*>(tile + wgmma::sw128<kRows>(row0 + 8, c0 + 16 * kk + 8 + col0)) = a[kk][3];
  }
}

}  // namespace loom::cuda::flash::sm90
