// The NF4 B operand of the Hopper grouped GEMM (kernels/cuda/grouped_gemm_sm90.cu with kNf4): a QLoRA
// expert's weight W [out, in] read as its packed 4-bit codes and block scales (kernels/nf4.h) and
// dequantised by the block's threads straight into the stage's swizzled B tile, so the product
// never reads (or needs the memory for) a bf16 copy of the experts. The values written are those of
// nf4_dequantize (code * absmax in f32, each product rounded once, then to bf16 by round to
// nearest), so the product equals dequantise-then-multiply bit for bit.
//
// Layouts (W's rows are blocks of 64 along `in`, so each 64-element run of a row that starts at a
// multiple of 64 is one NF4 block and one 128-byte row of a swizzled tile):
//   kTransB (forward, y = x W^T): B = W as [N = out, K = in], K-major; the tile's kBN rows x 64
//     columns are kBN blocks, row i = W row n0 + i, columns k0 .. k0 + 63.
//   !kTransB (input gradient, dx = dy W): B = W as [K = out, N = in], MN-major; the tile's 64 rows
//     (k0 ..) x kBN columns (n0 ..) are 64 x kBN / 64 blocks in kBN / 64 column blocks.
// Each of 256 places (the cp.async kernel's threads; two a thread in the TMA kernel's producer
// warpgroup) takes kBN / 4 consecutive elements of one block (all 64 of a 256-wide tile's block, half
// of a 128-wide one's): 32 or 16 packed bytes in one or two 16-byte loads, issued 2-3 k-steps before
// they are converted (a ring of Nf4Pending in the kernel), so that their latency hides behind that
// many steps of wgmma. Double-quantised scales look their code up in a
// shared-memory copy of the nested code book when every problem shares one (Loom's quantiser makes
// one per device), else in each weight's own (bitsandbytes checkpoints carry one a weight).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/wgmma.cuh"
#include "kernels/nf4.h"

namespace loom::cuda::nf4g {

// The NF4 code book, copied into each block's shared memory (indexing a local array would put it
// on the stack).
static __constant__ float kNf4CodeBook[16] = LOOM_NF4_CODE;  // one per translation unit

// One problem's NF4 weight, as the kernel reads it (device memory, after the Problem list).
struct Nf4Problem {
  const uint8_t* packed;        // [out * in / 2]
  const float* absmax;          // [blocks], or null when double-quantised
  const uint8_t* qabsmax;       // [blocks] codes of nested_code
  const float* nested_absmax;   // [blocks / 256]
  const float* nested_code;     // [256]
  float offset;
  int32_t unused;
};
static_assert(sizeof(Nf4Problem) == 48, "6 pointer slots per problem");

// What a thread loaded for one step: its packed codes and block scale, and where they go (kept small:
// a thread holds several of these while their loads are in flight).
template <int kBN>
struct Nf4Pending {
  static constexpr int kElems = kBN / 4;      // elements of one block this thread converts
  static constexpr int kVecs = kElems / 32;   // 16-byte loads of packed codes (32 elements each)
  uint4 q[kVecs];
  float scale;   // absmax, or the nested absmax (double quantisation)
  int dst;       // the run's first element in the block's shared memory (-1: nothing pending)
  uint32_t meta; // the tile row's swizzle (bits 0-2), zeros (bit 3), double-quantised (bit 4),
                 // the block's absmax code (bits 8-15), the problem (bits 16-31)
};

// Place `index` (0..255: a thread's, or, in the TMA kernel's 128-thread producer, tid and tid + 128)
// in a tile: kBN blocks, 256 / kBN places per block. MN-major tiles take rows fastest: consecutive
// places in consecutive rows of one 64-column block, whose 16-byte stores land in different banks
// (the swizzle differs row to row; the same row of the four blocks, 8 KiB apart, would share them).
template <int kBN, bool kTransB>
struct Nf4Place {
  static constexpr int kPerBlock = 256 / kBN;  // places per block: 1 or 2
  int row, cblock, part;  // tile row, 64-column block (MN-major), which part of the block's 64 elements
  __device__ __forceinline__ explicit Nf4Place(int index) {
    const int chunk = index / kPerBlock;
    part = index % kPerBlock;
    if constexpr (kTransB) {
      row = chunk, cblock = 0;
    } else {
      row = chunk % 64, cblock = chunk / 64;
    }
  }
};

// Issues the loads of this thread's part of one step's B tile (rows/columns past the problem or
// the reduction depth become zeros): `n0`, `k0` the tile's origin, `n`, `depth` the problem's N and
// K, `ld` = in (the weight's row length); `b_off` the tile's first element in shared memory.
template <int kBN, bool kTransB>
__device__ __forceinline__ void nf4_issue(const Nf4Problem& w, int problem, const Nf4Place<kBN, kTransB>& pl, int n0,
                                          int k0, int n, int depth, int64_t ld, int b_off, Nf4Pending<kBN>& out) {
  using P = Nf4Pending<kBN>;
  int64_t row, col;
  bool ok;
  if constexpr (kTransB) {
    row = n0 + pl.row, col = k0;
    ok = row < n && k0 < depth;
    out.dst = b_off + pl.row * 64;
  } else {
    row = k0 + pl.row, col = n0 + 64 * pl.cblock;
    ok = row < depth && col < n;
    out.dst = b_off + pl.cblock * (64 * 64) + pl.row * 64;
  }
  out.meta = uint32_t(pl.row & 7) | (ok ? 0u : 8u) | (uint32_t(problem) << 16);
  if (!ok) return;
  const int64_t first = row * ld + col + int64_t(pl.part) * P::kElems;  // element index in W
  const uint4* src = reinterpret_cast<const uint4*>(w.packed + first / 2);
#pragma unroll
  for (int v = 0; v < P::kVecs; ++v) out.q[v] = __ldg(src + v);
  const int64_t block = first / kNf4Block;
  if (w.absmax) {
    out.scale = __ldg(w.absmax + block);
  } else {
    out.meta |= 16u | (uint32_t(__ldg(w.qabsmax + block)) << 8);
    out.scale = __ldg(w.nested_absmax + block / kNf4NestedBlock);
  }
}

// Converts what nf4_issue loaded and stores it into shared memory at `smem`: 16-byte chunk c of the
// run goes to chunk (c0 + c) ^ key of its 128-byte row (wgmma::sw128's swizzle). `book`: the nested
// code book in shared memory when every problem shares it, else null (each weight's own is read).
// With the book, a scale waits only on shared memory and on its descriptor's offset (in L1).
template <int kBN>
__device__ __forceinline__ void nf4_store(const Nf4Pending<kBN>& p, int part, const float* __restrict__ nf4_code,
                                          const float* book, const Nf4Problem* __restrict__ nf4s, bf16* smem) {
  using P = Nf4Pending<kBN>;
  constexpr int kChunks = P::kElems / 8;
  const int c0 = part * kChunks, key = int(p.meta & 7u);
  bf16* dst = smem + p.dst;
  if (p.meta & 8u) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) *reinterpret_cast<uint4*>(dst + (((c0 + c) ^ key) << 3)) = make_uint4(0, 0, 0, 0);
    return;
  }
  // nf4_block_absmax's arithmetic: two roundings, nothing fused.
  float a = p.scale;
  if (p.meta & 16u) {
    const uint32_t code = (p.meta >> 8) & 0xffu;
    const Nf4Problem& w = nf4s[p.meta >> 16];
    a = __fadd_rn(__fmul_rn(book ? book[code] : __ldg(w.nested_code + code), p.scale), w.offset);
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const uint4 v = p.q[c / 4];
    const uint32_t word = (c % 4 == 0) ? v.x : (c % 4 == 1) ? v.y : (c % 4 == 2) ? v.z : v.w;  // 8 codes
    uint32_t out[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (word >> (8 * b)) & 0xffu;  // elements 2b (high nibble) and 2b + 1
      const __nv_bfloat162 pair =
          __floats2bfloat162_rn(__fmul_rn(nf4_code[byte >> 4], a), __fmul_rn(nf4_code[byte & 15u], a));
      out[b] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    *reinterpret_cast<uint4*>(dst + (((c0 + c) ^ key) << 3)) = make_uint4(out[0], out[1], out[2], out[3]);
  }
}

// fn(std::integral_constant<int, slot>) for a runtime slot in [0, kN) (kN <= 3): a ring of Nf4Pending
// indexed by a constant in each branch stays in fixed registers (shifting it, or indexing it at run
// time, copies registers whose loads may still be in flight and so waits for them).
template <int kN, class Fn>
__device__ __forceinline__ void with_slot(int slot, const Fn& fn) {
  static_assert(kN >= 1 && kN <= 3, "rings of 1 to 3 slots");
  if (slot == 0) return fn(std::integral_constant<int, 0>{});
  if constexpr (kN >= 2) {
    if (slot == 1) return fn(std::integral_constant<int, 1>{});
  }
  if constexpr (kN >= 3) fn(std::integral_constant<int, 2>{});
}

}  // namespace loom::cuda::nf4g
