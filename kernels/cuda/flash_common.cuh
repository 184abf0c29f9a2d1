// Building blocks of the flash-attention kernels (flash_attention_fwd.cu, flash_attention_bwd.cu):
// bf16 tensor-core MMA (mma.sync m16n8k16, f32 accumulate), ldmatrix, cp.async tile loads into
// XOR-swizzled shared memory. Which (query, key) pairs and tiles are visible: flash_mask.cuh.
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

}  // namespace loom::cuda::flash
