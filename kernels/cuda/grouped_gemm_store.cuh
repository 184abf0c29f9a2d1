// The epilogue of the Hopper grouped GEMMs (grouped_gemm_sm90.cu, grouped_gemm_sm90_tma.cu): one
// warpgroup's m64nN f32 accumulators to global memory, C = alpha acc + beta C, in pairs of columns.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common.h"

namespace loom::cuda::grouped {

__device__ __forceinline__ void store_pair(float* p, float x, float y) { *reinterpret_cast<float2*>(p) = {x, y}; }
__device__ __forceinline__ void store_pair(bf16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ float2 load_pair(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 load_pair(const bf16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

// out[row0 + 8 h, col0 + 8 j + (0, 1)] = alpha acc[4 j + 2 h + (0, 1)] + beta out[...] for rows < rows and
// columns < n (n even: a pair is wholly in or out): lane l of warp w of a warpgroup holds acc[4 j + e] =
// (row 16 w + l / 4 + 8 (e / 2), column 8 j + 2 (l % 4) + e % 2), so the caller passes row0 = its tile
// row + 16 (w % 4) + l / 4 and col0 = its tile column + 2 (l % 4). With beta, the old values of
// kGroups column groups (2 kGroups pairs a thread) are loaded before the first of their stores: loads
// interleaved with stores to the same array wait one memory latency each (the compiler cannot move a
// load above a store that may alias it), which made y += x W^T 3-6x slower than y = x W^T (H200,
// session 32: Qwen3-30B-A3B's gate_up forward 3548 us against 1121, down 3913 against 668).
template <class TC, int kBN, int kGroups>
__device__ __forceinline__ void store_acc(TC* out, int64_t ldc, int row0, int rows, int col0, int n,
                                          const float (&acc)[kBN / 2], float alpha, float beta) {
#pragma unroll
  for (int j0 = 0; j0 < kBN / 8; j0 += kGroups) {
    float2 old[2][kGroups];
    if (beta != 0.f) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + 8 * h;
        const TC* src = out + int64_t(row) * ldc;
#pragma unroll
        for (int j = 0; j < kGroups; ++j) {
          const int col = col0 + 8 * (j0 + j);
          old[h][j] = row < rows && col < n ? load_pair(src + col) : make_float2(0.f, 0.f);
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 8 * h;
      if (row >= rows) continue;
      TC* dst = out + int64_t(row) * ldc;
#pragma unroll
      for (int j = 0; j < kGroups; ++j) {
        const int col = col0 + 8 * (j0 + j);
        if (col >= n) continue;
        float x = alpha * acc[4 * (j0 + j) + 2 * h], y = alpha * acc[4 * (j0 + j) + 2 * h + 1];
        if (beta != 0.f) x = fmaf(beta, old[h][j].x, x), y = fmaf(beta, old[h][j].y, y);
        store_pair(dst + col, x, y);
      }
    }
  }
}

}  // namespace loom::cuda::grouped
