// Building blocks of the flash-attention kernels (flash_attention_fwd.cu, flash_attention_bwd.cu):
// bf16 tensor-core MMA (mma.sync m16n8k16, f32 accumulate), ldmatrix, cp.async tile loads into
// XOR-swizzled shared memory, and the visibility rule of kernels/attention.h per (query, key).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cuda/cuda_common.cuh"

namespace loom::cuda::flash {

constexpr float kLog2e = 1.4426950408889634f;

// ---- shared memory tiles ----
// A tile of kRows x kD bf16 (kD a multiple of 64), rows of kD / 8 16-byte chunks; chunk c of row r
// is stored at chunk c ^ (r & 7), so the 8 rows an ldmatrix phase reads hit 8 different bank
// groups. Returns the element offset of (r, col).
template <int kD>
__device__ __forceinline__ int swz(int r, int col) {
  static_assert(kD % 64 == 0, "a swizzled row holds a multiple of 8 chunks");
  return r * kD + ((((col >> 3) ^ (r & 7))) << 3) + (col & 7);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, zero-filled when !pred (the source is not read then).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  const int bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(bytes));
}
// 4 bytes global -> shared (through L1), zero-filled when !pred.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool pred) {
  const int bytes = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kN>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kN));
}

// Loads rows [row0, row0 + kRows) of a [*, stride] bf16 matrix (row r at base + r * stride,
// d valid columns) into a swizzled kRows x kD tile; rows >= row_end and columns >= d are zeros.
// Every thread of the block (kThreads of them) takes one 16-byte column chunk of every
// kThreads / (kD / 8)-th row.
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* base, int64_t stride, int64_t row0,
                                          int64_t row_end, int d) {
  constexpr int kChunksPerRow = kD / 8;
  static_assert(kThreads % kChunksPerRow == 0, "whole rows per pass");
  constexpr int kRowStep = kThreads / kChunksPerRow;
  static_assert(kRows % kRowStep == 0, "tile rows must divide among the passes");
  const int r0 = int(threadIdx.x) / kChunksPerRow, col = (int(threadIdx.x) % kChunksPerRow) * 8;
  const bool col_ok = col < d;
  const bf16* src = base + (row0 + r0) * stride + col;
#pragma unroll
  for (int it = 0; it < kRows / kRowStep; ++it) {
    const int r = r0 + it * kRowStep;
    const bool ok = col_ok && row0 + r < row_end;
    cp_async16(tile + swz<kD>(r, col), ok ? src + int64_t(it) * kRowStep * stride : base, ok);
  }
}

// ---- ldmatrix and mma ----
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c (16x8 f32) += a (16x16 bf16, row) * b (16x8 bf16, col).
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Fragment loads from swizzled tiles. An ldmatrix.x4 has each lane point at one row of one of four
// 8x8 matrices; which row and which 8-column half depend on the lane alone, so each kernel computes
// a FragLane once and every load is base + (row0 + row) * kD + (col0 ^ x): for row0 a multiple of 8
// and col0 of 16, the swizzle of that element is the XOR of col0 with a per-lane constant.
struct FragLane {
  int row, x;
};
__device__ __forceinline__ FragLane make_frag_lane(int row, int col_half) {
  return {row, col_half ^ ((row & 7) << 3)};
}
// Lanes 0-15 rows 0-15 at column 0, lanes 16-31 rows 0-15 at column 8: an A fragment of a
// row-major tile (M = rows), or B fragments where the tile's rows are K (trans).
__device__ __forceinline__ FragLane frag_rows16(int lane) { return make_frag_lane(lane & 15, (lane >> 4) << 3); }
// Lanes 0-7 / 8-15 / 16-23 / 24-31 at (rows 0-7, col 0) / (rows 0-7, col 8) / (rows 8-15, col 0) /
// (rows 8-15, col 8): B fragments where the tile's rows are N, or an A fragment of a transposed tile.
__device__ __forceinline__ FragLane frag_rows8x2(int lane) {
  return make_frag_lane((lane & 7) + ((lane >> 4) << 3), ((lane >> 3) & 1) << 3);
}
template <int kD>
__device__ __forceinline__ const bf16* frag_ptr(const bf16* tile, FragLane f, int row0, int col0) {
  return tile + (row0 + f.row) * kD + (col0 ^ f.x);
}

// A fragment (16 x 16 at (row0, col0)) of a row-major tile: rows are the MMA's M, columns its K.
// f = frag_rows16.
template <int kD>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int row0, int col0, FragLane f) {
  ldsm_x4(a, frag_ptr<kD>(tile, f, row0, col0));
}
// A fragment of the TRANSPOSE of a tile: MMA rows are tile columns [col0, col0 + 16), MMA K are tile
// rows [row0, row0 + 16). f = frag_rows8x2.
template <int kD>
__device__ __forceinline__ void load_a_t(uint32_t (&a)[4], const bf16* tile, int row0, int col0, FragLane f) {
  ldsm_x4_t(a, frag_ptr<kD>(tile, f, row0, col0));
}
// B fragments for two adjacent 8-wide N tiles where the tile's rows are N and its columns K
// (B = tile^T, as K in Q K^T): b[0], b[1] for rows n0.., b[2], b[3] for n0 + 8... f = frag_rows8x2.
template <int kD>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const bf16* tile, int n0, int k0, FragLane f) {
  ldsm_x4(b, frag_ptr<kD>(tile, f, n0, k0));
}
// B fragments for two adjacent N tiles where the tile's rows are K and its columns N (B = tile, as
// V in P V). f = frag_rows16.
template <int kD>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const bf16* tile, int k0, int n0, FragLane f) {
  ldsm_x4_t(b, frag_ptr<kD>(tile, f, k0, n0));
}

// 2^x on the special-function unit (max relative error ~2^-22; flushes denormal results to 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- visibility (kernels/attention.h) ----
// Query i sees key j when j <= i, i - j < window (window > 0), and both share a segment.
struct Visibility {
  int64_t seq, window;
  const int32_t* seg;  // this batch row's segment ids or null
  __device__ __forceinline__ bool operator()(int64_t i, int64_t j) const {
    return j <= i && i < seq && (window <= 0 || i - j < window) && (seg == nullptr || seg[i] == seg[j]);
  }
};

// How a (query tile, key tile) pair must be treated.
enum class TileKind { kSkip, kFull, kMasked };

// Segment id range of rows [r0, r0 + n) (clamped to seq); every lane of the warp gets it.
__device__ __forceinline__ void warp_seg_range(const int32_t* seg, int64_t r0, int n, int64_t seq, int lane,
                                               int32_t* lo, int32_t* hi) {
  int32_t mn = INT32_MAX, mx = INT32_MIN;
  for (int t = lane; t < n; t += 32) {
    if (r0 + t < seq) {
      const int32_t s = seg[r0 + t];
      mn = min(mn, s);
      mx = max(mx, s);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  }
  *lo = mn;
  *hi = mx;
}

// Classifies queries [q0, q0 + nq) against keys [k0, k0 + nk): skip when no pair can be visible,
// full when every pair with both ends inside [0, seq) is visible, masked otherwise. qs/ks are
// the tiles' segment-id ranges (ignored without segments).
__device__ __forceinline__ TileKind classify(const AttentionParams& p, int64_t q0, int nq, int64_t k0, int nk,
                                             int32_t qs_lo, int32_t qs_hi, int32_t ks_lo, int32_t ks_hi) {
  const int64_t q1 = q0 + nq - 1, k1 = k0 + nk - 1;  // last query, last key of the tiles
  if (k0 > q1) return TileKind::kSkip;                                  // every key after every query
  if (p.window > 0 && q0 - k1 >= p.window) return TileKind::kSkip;      // every key out of the window
  if (p.segment_ids && (ks_hi < qs_lo || ks_lo > qs_hi)) return TileKind::kSkip;  // no shared segment
  const bool causal_ok = k1 <= q0;
  const bool window_ok = p.window <= 0 || q1 - k0 < p.window;
  const bool seg_ok = !p.segment_ids || (qs_lo == qs_hi && ks_lo == ks_hi && qs_lo == ks_lo);
  const bool in_range = q1 < p.seq && k1 < p.seq;
  return causal_ok && window_ok && seg_ok && in_range ? TileKind::kFull : TileKind::kMasked;
}

// First key tile (of kBc keys) at or after t that is not skipped for queries [q0, q0 + kBr); its
// kind in *kind. Returns t_end when there is none.
template <int kBr, int kBc>
__device__ __forceinline__ int next_key_tile(const AttentionParams& p, const int32_t* seg, int t, int t_end, int64_t q0,
                                             int32_t qs_lo, int32_t qs_hi, int lane, TileKind* kind) {
  for (; t < t_end; ++t) {
    int32_t lo = 0, hi = 0;
    if (seg) warp_seg_range(seg, int64_t(t) * kBc, kBc, p.seq, lane, &lo, &hi);
    *kind = classify(p, q0, kBr, int64_t(t) * kBc, kBc, qs_lo, qs_hi, lo, hi);
    if (*kind != TileKind::kSkip) break;
  }
  return t;
}

// Backward: the first (head-in-group, query tile of kBr rows) item at or after idx that is not
// skipped for keys [k0, k0 + kBc); items run over query tiles [qt0, qt0 + nqt) for each head of the
// group. Returns n_items when there is none.
template <int kBr, int kBc>
__device__ __forceinline__ int next_item(const AttentionParams& p, const int32_t* seg, int idx, int n_items, int qt0,
                                         int nqt, int64_t k0, int32_t ks_lo, int32_t ks_hi, int lane, TileKind* kind) {
  for (; idx < n_items; ++idx) {
    const int64_t q0 = int64_t(qt0 + idx % nqt) * kBr;
    int32_t lo = 0, hi = 0;
    if (seg) warp_seg_range(seg, q0, kBr, p.seq, lane, &lo, &hi);
    *kind = classify(p, q0, kBr, k0, kBc, lo, hi, ks_lo, ks_hi);
    if (*kind != TileKind::kSkip) break;
  }
  return idx;
}

// Soft-capping in the units of the raw q.k dot product, so that the kernels keep multiplying by
// scale * log2(e) afterwards: returns dot' with scale * dot' = softcap * tanh(scale * dot / softcap)
// and sets *dcap = d(capped) / d(scaled) = 1 - tanh^2. Without a cap: dot unchanged, dcap = 1.
__device__ __forceinline__ float cap_dot(float dot, float scale, float softcap, float* dcap) {
  if (softcap > 0.f) {
    const float t = tanhf(dot * (scale / softcap));
    *dcap = 1.f - t * t;
    return t * (softcap / scale);
  }
  *dcap = 1.f;
  return dot;
}

}  // namespace loom::cuda::flash
