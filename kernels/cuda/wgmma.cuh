// Hopper (sm_90a) building blocks of the wgmma flash-attention kernels: 128-byte-swizzled shared
// memory tiles filled by cp.async, their wgmma matrix descriptors (K-major and MN-major), and the
// fence / commit / wait instructions. The mma wrappers themselves are in wgmma_ops.cuh.
//
// Accumulator layout of wgmma m64nNk16 (f32): warp w of the warpgroup holds rows 16 w .. 16 w + 15;
// lane l holds d[4 n + e] = (row 16 w + l / 4 + 8 (e / 2), column 8 n + 2 (l % 4) + e % 2). An A
// operand from registers is, per warp, the m16n8k16 A fragment of its 16 rows: for k-step kk,
// {d[8 kk], d[8 kk + 1]}, {d[8 kk + 2], d[8 kk + 3]}, {d[8 kk + 4], ...}, {d[8 kk + 6], ...} of an
// accumulator over those columns, packed to bf16 pairs.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/wgmma_ops.cuh"

namespace loom::cuda::wgmma {

using flash::smem_u32;

// ---- 128-byte-swizzled tiles ----
// A kRows x kD bf16 tile (kD a multiple of 64) is stored as kD / 64 column blocks of kRows rows of
// 128 bytes; 16-byte chunk c of row r sits at chunk c ^ (r % 8) of that row. The tile must start
// on a 1024-byte boundary (the swizzle pattern repeats every 8 rows = 1024 bytes and wgmma applies
// it to the absolute shared-memory address). Returns the element offset of (r, col).
template <int kRows>
__device__ __forceinline__ int sw128(int r, int col) {
  return (col >> 6) * (kRows * 64) + r * 64 + ((((col >> 3) & 7) ^ (r & 7)) << 3) + (col & 7);
}

// Loads rows [row0, row0 + kRows) of a [*, stride] bf16 matrix (d valid columns) into a swizzled
// tile; rows >= row_end and columns >= d become zeros. Every thread (kThreads of them) takes
// 16-byte chunks kThreads apart.
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_tile_sw128(bf16* tile, const bf16* base, int64_t stride, int64_t row0,
                                                int64_t row_end, int d, int tid) {
  constexpr int kChunksPerRow = kD / 8, kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "whole passes");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int idx = tid + it * kThreads;
    const int r = idx / kChunksPerRow, col = (idx % kChunksPerRow) * 8;
    const bool ok = col < d && row0 + r < row_end;
    flash::cp_async16(tile + sw128<kRows>(r, col), ok ? base + (row0 + r) * stride + col : base, ok);
  }
}

// load_tile_sw128 with the per-thread work hoisted: a thread's 16-byte chunks sit kStep rows apart
// in one column, so (for kStep a multiple of 8) they share one swizzle and their shared and global
// offsets advance by constants; a tile whose rows are all valid loads without per-chunk checks.
template <int kRows, int kD, int kThreads>
struct TileLoader {
  static constexpr int kChunksPerRow = kD / 8, kStep = kThreads / kChunksPerRow, kIters = kRows / kStep;
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kStep == 0, "whole rows per pass");
  int r0, col, soff;
  __device__ __forceinline__ explicit TileLoader(int tid)
      : r0(tid / kChunksPerRow), col((tid % kChunksPerRow) * 8), soff(sw128<kRows>(tid / kChunksPerRow, col)) {}
  // As load_tile_sw128(tile, base, stride, row0, row_end, d, tid).
  __device__ __forceinline__ void load(bf16* tile, const bf16* base, int64_t stride, int64_t row0, int64_t row_end,
                                       int d) const {
    if constexpr (kStep % 8 != 0) {
      load_tile_sw128<kRows, kD, kThreads>(tile, base, stride, row0, row_end, d, r0 * kChunksPerRow + col / 8);
    } else {
      const bf16* src = base + (row0 + r0) * stride + col;
      const int64_t step = int64_t(kStep) * stride;
      bf16* dst = tile + soff;
      if (col < d && row0 + kRows <= row_end) {
#pragma unroll
        for (int it = 0; it < kIters; ++it) flash::cp_async16(dst + it * kStep * 64, src + it * step, true);
      } else {
        const bool col_ok = col < d;
#pragma unroll
        for (int it = 0; it < kIters; ++it) {
          const bool ok = col_ok && row0 + r0 + it * kStep < row_end;
          flash::cp_async16(dst + it * kStep * 64, ok ? src + it * step : base, ok);
        }
      }
    }
  }
};

// ---- descriptors ----
__device__ __forceinline__ uint64_t desc_encode(uint32_t x) { return uint64_t((x & 0x3FFFF) >> 4); }
// 128-byte swizzle (bits 62-63 = 1), base offset 0 (tiles are 1024-byte aligned).
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return desc_encode(addr) | (desc_encode(lbo) << 16) | (desc_encode(sbo) << 32) | (uint64_t(1) << 62);
}
// Descriptor of a swizzled tile's first element; the per-operand descriptors below add a byte
// offset (>> 4) to its start-address field, which cannot overflow inside the 228 KB of shared memory.
// `opaque` keeps the compiler from precomputing every per-step descriptor into registers of its own.
__device__ __forceinline__ uint64_t tile_desc(const bf16* tile, uint32_t lbo) {
  uint64_t d = make_desc(smem_u32(tile), lbo, 1024);
  asm volatile("" : "+l"(d));
  return d;
}
// K-major operand (rows are M or N, columns are K): rows [r0, r0 + 64 or N) at k-step kk (columns
// 16 kk .. 16 kk + 15) of a swizzled kRows-row tile whose tile_desc is `base` (any lbo: unused).
// 8-row groups are 1024 bytes apart; the step inside a 128-byte row moves the start address by 32
// bytes (wgmma applies the swizzle to the final address).
template <int kRows>
__device__ __forceinline__ uint64_t desc_k_major(uint64_t base, int r0, int kk) {
  return base + uint64_t(((kk >> 2) * kRows * 128 + r0 * 128 + (kk & 3) * 32) >> 4);
}
// MN-major operand (rows are K, columns are M or N): k-step kk is rows 16 kk .. 16 kk + 15, all
// columns from 0. `base` is tile_desc(tile, kRows * 128): the leading byte offset goes from one
// 64-column block to the next, the stride byte offset from one 8-row group to the next.
template <int kRows>
__device__ __forceinline__ uint64_t desc_mn_major(uint64_t base, int kk) {
  return base + uint64_t((kk * 16 * 128) >> 4);
}

// The executing thread's warpgroup (threadIdx.x / 128) as a warp-uniform value (one lane's, shuffled to
// the warp; every lane of the warp must call it): what derives from it (wgmma descriptors, tile
// offsets) then lives in uniform registers instead of being built per thread. Derived from threadIdx
// directly, the d128 warp-specialised backward spent about 370 of its 847 instructions a loop
// iteration building descriptors per thread, with a spill (sm_90a SASS, helper-25's audit); with
// this, 488 and none.
__device__ __forceinline__ int warpgroup() { return __shfl_sync(0xffffffffu, int(threadIdx.x) >> 7, 0); }

// ---- ordering ----
// Before the first wgmma of a batch, and after registers it reads (accumulators, A) were written.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kN>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kN) : "memory");
}
// Shared memory written by this thread's generic-proxy stores or cp.async, read next by wgmma.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accumulator reads or writes across a wgmma it cannot see into.
template <int kN>
__device__ __forceinline__ void fence_regs(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void fence_regs(uint32_t (&a)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}
// wait<kN>(), then fence_regs of each accumulator or fragment the completed products wrote.
template <int kN, class... Regs>
__device__ __forceinline__ void wait_regs(Regs&... regs) {
  wait<kN>();
  (fence_regs(regs), ...);
}

}  // namespace loom::cuda::wgmma
