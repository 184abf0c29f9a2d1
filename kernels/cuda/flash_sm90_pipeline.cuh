// The data movement and matrix-product issue of the Hopper flash-attention kernels that
// every-thread-loads (cp.async) and warp-specialised kernels share: the wgmma issue of a product
// over head_dim, the backward's Q / dO / lse / D stage loads, dQ's atomic addition and the dK, dV
// epilogue. Accumulator fragments as in flash_softmax.cuh.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/flash_mask.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace loom::cuda::flash::sm90 {

using wgmma::Wgmma;

// acc (64 x kN) = A B^T over kD columns, A rows a_row0.. of a swizzled kRowsA-row tile, B rows
// b_row0.. of a kRowsB-row one, both K-major (head_dim along the rows): issued after a fence, not
// committed.
template <int kD, int kRowsA, int kRowsB, int kN>
__device__ __forceinline__ void mma_rows(float (&acc)[kN / 2], uint64_t da, uint64_t db, int a_row0, int b_row0) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
    Wgmma<kN>::template ss<0, 0>(acc, wgmma::desc_k_major<kRowsA>(da, a_row0, kk), wgmma::desc_k_major<kRowsB>(db, b_row0, kk),
                                 kk > 0);
}

// S = Q K^T for the 64 query rows from q_row0 of a kBr-row Q tile against a kBc-key K tile, both
// swizzled with head_dim kD: issued, not waited for.
template <int kD, int kBr, int kBc>
__device__ __forceinline__ void issue_qk(float (&sacc)[kBc / 2], const bf16* sQ, const bf16* sK, int q_row0) {
  const uint64_t dq = wgmma::tile_desc(sQ, 16), dk = wgmma::tile_desc(sK, 16);
  wgmma::fence();
  mma_rows<kD, kBr, kBc, kBc>(sacc, dq, dk, q_row0, 0);
  wgmma::commit();
}

// ---- backward ----

// S^T = K Q^T and dP^T = V dO^T, the backward's first two products: the 64 keys from k_row0 of
// kRowsK-row K and V tiles against kN queries from q_row0 of kRowsQ-row Q and dO tiles, over kD
// (all four K-major): issued, committed and waited for.
template <int kD, int kRowsK, int kRowsQ, int kN>
__device__ __forceinline__ void scores_t(float (&st)[kN / 2], float (&dpt)[kN / 2], const bf16* sK, const bf16* sV,
                                         const bf16* sQ, const bf16* sdO, int k_row0, int q_row0) {
  const uint64_t dK = wgmma::tile_desc(sK, 16), dV = wgmma::tile_desc(sV, 16);
  const uint64_t dQ = wgmma::tile_desc(sQ, 16), ddO = wgmma::tile_desc(sdO, 16);
  wgmma::fence();
  mma_rows<kD, kRowsK, kRowsQ, kN>(st, dK, dQ, k_row0, q_row0);
  mma_rows<kD, kRowsK, kRowsQ, kN>(dpt, dV, ddO, k_row0, q_row0);
  wgmma::commit();
  wgmma::wait_regs<0>(st, dpt);
}

// dQ (64 queries x kNq columns) = dS K, dS^T (kBc keys x 64 queries) read M-major and K (kBc
// keys) N-major, for warpgroup `part` of two: with kSplitK its own 64 keys and all kNq columns,
// else all kBc keys and columns kNq part ..; issued and committed, not waited for. Returns the
// first column.
template <int kBc, int kNq, bool kSplitK>
__device__ __forceinline__ int issue_dq(float (&dqa)[kNq / 2], const bf16* sdS, const bf16* sK, int part) {
  static_assert(kNq % 64 == 0, "dQ column blocks start on a 64-column boundary");
  constexpr int kKSteps = kSplitK ? 4 : kBc / 16;
  const int kk0 = kSplitK ? 4 * part : 0, n0 = kSplitK ? 0 : kNq * part;
  const uint64_t ddS = wgmma::tile_desc(sdS, kBc * 128);
  const uint64_t dKn = wgmma::tile_desc(sK, kBc * 128) + uint64_t(((n0 >> 6) * kBc * 128) >> 4);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk)
    Wgmma<kNq>::template ss<1, 1>(dqa, wgmma::desc_mn_major<kBc>(ddS, kk0 + kk), wgmma::desc_mn_major<kBc>(dKn, kk0 + kk),
                                  kk > 0);
  wgmma::commit();
  return n0;
}

// dV += P^T dO and dK += dS^T Q for the kBc keys x kN head_dim columns from c0 (a multiple of 64):
// P^T and dS^T (kBc keys x kBr queries, swizzled, K-major) and dO and Q (kBr rows, 64-column blocks,
// read N-major) in shared memory; issued after a fence and committed, not waited for. kTwoGroups: dV
// and dK committed apart (two groups), so that a caller can hand dO back before dK is done.
template <int kBr, int kBc, int kN, bool kTwoGroups = false>
__device__ __forceinline__ void issue_dv_dk(float (&dva)[kN / 2], float (&dka)[kN / 2], const bf16* sPt,
                                            const bf16* sdSt, const bf16* sdO, const bf16* sQ, int c0) {
  const uint64_t dPt = wgmma::tile_desc(sPt, 16), ddSt = wgmma::tile_desc(sdSt, 16);
  const uint64_t col_block = uint64_t(((c0 >> 6) * kBr * 128) >> 4);
  const uint64_t ddOn = wgmma::tile_desc(sdO, kBr * 128) + col_block, dQn = wgmma::tile_desc(sQ, kBr * 128) + col_block;
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kBr / 16; ++kk)
    Wgmma<kN>::template ss<0, 1>(dva, wgmma::desc_k_major<kBc>(dPt, 0, kk), wgmma::desc_mn_major<kBr>(ddOn, kk), 1);
  if constexpr (kTwoGroups) wgmma::commit();
#pragma unroll
  for (int kk = 0; kk < kBr / 16; ++kk)
    Wgmma<kN>::template ss<0, 1>(dka, wgmma::desc_k_major<kBc>(ddSt, 0, kk), wgmma::desc_mn_major<kBr>(dQn, kk), 1);
  wgmma::commit();
}

// The warp-specialised backward's dQ tiles (64 query rows of f32, in boxes of kDqBox columns with the
// 128-byte swizzle of tma::make_bshd_map_f32, one box after another). store_dq_tile: a consumer
// thread's m64 accumulator fragment (kNq columns) into its tile: row r0 (+ 8), columns 8 nn + col0
// (+ 1) go to box (8 nn) / 32, 16-byte chunk ((8 nn) % 32 + col0) / 4 swizzled with the row's low
// three bits (lane >> 2). With kAdd the fragment is added to what the tile holds at the same places
// (another warpgroup's fragment of the same rows and columns, written by the same thread index).
constexpr int kDqBox = 32;
template <int kNq, bool kAdd = false>
__device__ __forceinline__ void store_dq_tile(const float (&dqa)[kNq / 2], float* tile, int warp, int lane) {
  constexpr int kRows = 64;
  const int r0 = 16 * (warp & 3) + (lane >> 2), sw = lane >> 2, col0 = 2 * (lane & 3);
#pragma unroll
  for (int nn = 0; nn < kNq / 8; ++nn) {
    const int cc = (8 * nn) % kDqBox + col0;
    float* box = tile + (8 * nn / kDqBox) * (kRows * kDqBox) + ((((cc >> 2) ^ sw) << 2) | (cc & 3));
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float2* at = reinterpret_cast<float2*>(box + (r0 + 8 * r) * kDqBox);
      float2 v = make_float2(dqa[4 * nn + 2 * r], dqa[4 * nn + 2 * r + 1]);
      if constexpr (kAdd) {
        const float2 old = *at;
        v.x += old.x, v.y += old.y;
      }
      *at = v;
    }
  }
}

// One backward item's stage through cp.async: Q and dO rows [q0, q0 + kBr) of query head h
// (swizzled; zeros past seq and head_dim) and those rows' lse and D (zeros past seq) into
// stat[0, kBr) and stat[kBr, 2 kBr). Every thread of the block (kThreads) takes part.
template <int kBr, int kD, int kThreads>
struct BwdStageLoader {
  static_assert(kThreads >= 2 * kBr, "a thread per lse and D value");
  wgmma::TileLoader<kBr, kD, kThreads> tiles;
  int tid;
  __device__ __forceinline__ explicit BwdStageLoader(int tid_) : tiles(tid_), tid(tid_) {}
  __device__ __forceinline__ void load(const AttentionParams& p, const bf16* q, const bf16* dout, const float* lse,
                                       const float* dsum, int64_t b, int64_t h, int64_t q0, bf16* sq, bf16* sdo,
                                       float* stat) const {
    const int64_t off = (b * p.seq * p.heads + h) * p.head_dim, q_stride = p.heads * p.head_dim;
    const int hd = int(p.head_dim);
    tiles.load(sq, q + off, q_stride, q0, p.seq, hd);
    tiles.load(sdo, dout + off, q_stride, q0, p.seq, hd);
    if (tid < 2 * kBr) {
      const int r = tid & (kBr - 1);
      const float* src = (tid < kBr ? lse : dsum) + (b * p.heads + h) * p.seq + q0 + r;
      flash::cp_async4(stat + tid, q0 + r < p.seq ? src : lse, q0 + r < p.seq);
    }
  }
};

// A cp.async backward block's walk over one key tile: kBc keys from k0 = blockIdx.z kBc of kv head
// g = blockIdx.x, batch b = blockIdx.y (the slowest grid dimension, first tile first: the most
// queries see it). Shared memory from `smem` (1024-byte aligned): K and V (kBc rows of kD each), then
// two stages of Q and of dO (kBr rows); stats: two stages of lse [kBr] then D [kBr]. start() loads K, V and
// the first item (KeyTileItems: a query tile of one query head) that sees the tile; each round,
// prefetch() waits for the current item's stage and loads the next into the other one.
template <int kBr, int kBc, int kD, int kThreads>
struct BwdKeyTile {
  static constexpr int kKvElems = kBc * kD, kQElems = kBr * kD;
  bf16 *sK, *sV, *sQ0, *sdO0;
  float* sStat0;
  int64_t k0, g, b;
  const int32_t* seg;  // the batch row's segment ids, or null
  KeyTileItems<kBr, kBc> items;
  BwdStageLoader<kBr, kD, kThreads> loader;
  int item = 0, stage = 0;
  TileKind kind = TileKind::kSkip;

  __device__ __forceinline__ BwdKeyTile(const AttentionParams& p, bf16* smem, float* stats, int tid, int lane)
      : sK(smem), sV(smem + kKvElems), sQ0(smem + 2 * kKvElems), sdO0(smem + 2 * kKvElems + 2 * kQElems), sStat0(stats),
        k0(int64_t(blockIdx.z) * kBc), g(blockIdx.x), b(blockIdx.y),
        seg(p.segment_ids ? p.segment_ids + int64_t(blockIdx.y) * p.seq : nullptr), items(p, seg, k0, lane),
        loader(tid) {}
  // The first element past K, V and the Q and dO stages.
  static __device__ __forceinline__ bf16* end(bf16* smem) { return smem + 2 * kKvElems + 4 * kQElems; }

  __device__ __forceinline__ void load_item(const AttentionParams& p, const bf16* q, const bf16* dout,
                                            const float* lse, const float* dsum, int it, int st) const {
    loader.load(p, q, dout, lse, dsum, b, items.head(g, it), items.q_start(it), sQ0 + st * kBr * kD,
                sdO0 + st * kBr * kD, sStat0 + st * 2 * kBr);
  }
  // K and V, and the first item into stage 0: one cp.async group.
  __device__ __forceinline__ void start(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v,
                                        const bf16* dout, const float* lse, const float* dsum, int tid, int lane) {
    const int64_t kv_off = (b * p.seq * p.kv_heads + g) * p.head_dim, kv_stride = p.kv_heads * p.head_dim;
    wgmma::load_tile_sw128<kBc, kD, kThreads>(sK, k + kv_off, kv_stride, k0, p.seq, int(p.head_dim), tid);
    wgmma::load_tile_sw128<kBc, kD, kThreads>(sV, v + kv_off, kv_stride, k0, p.seq, int(p.head_dim), tid);
    item = items.first(p, seg, k0, lane, &kind);
    if (item < items.n_items) load_item(p, q, dout, lse, dsum, item, 0);
    flash::cp_async_commit();
  }
  __device__ __forceinline__ bool more() const { return item < items.n_items; }
  // The next item (its kind in *next_kind) after the current one's stage has landed and every warp
  // is done with the other stage (and with what the kernel shares between rounds), loading it there.
  __device__ __forceinline__ int prefetch(const AttentionParams& p, const bf16* q, const bf16* dout, const float* lse,
                                          const float* dsum, int lane, TileKind* next_kind) const {
    const int next = items.next(p, seg, item + 1, k0, lane, next_kind);
    flash::cp_async_wait<0>();
    wgmma::fence_proxy_async();
    __syncthreads();
    if (next < items.n_items) load_item(p, q, dout, lse, dsum, next, stage ^ 1);
    flash::cp_async_commit();
    return next;
  }
  __device__ __forceinline__ const bf16* q_tile() const { return sQ0 + stage * kBr * kD; }
  __device__ __forceinline__ const bf16* do_tile() const { return sdO0 + stage * kBr * kD; }
  __device__ __forceinline__ const float* stats() const { return sStat0 + stage * 2 * kBr; }
  __device__ __forceinline__ int64_t head() const { return items.head(g, item); }
  __device__ __forceinline__ int64_t q_start() const { return items.q_start(item); }
  __device__ __forceinline__ void advance(int next, TileKind next_kind) {
    stage ^= 1;
    item = next;
    kind = next_kind;
  }
};

// Adds this thread's dQ fragment (kNq columns from n0 of query rows q0 + 16 (warp % 4) + lane / 4
// and + 8, query head h) to the f32 accumulator [batch, seq, heads, head_dim] with 16-byte atomics.
// Lane pairs swap halves so that each adds 4 consecutive columns of one row: the even lane row
// i0 at columns col0 .. col0 + 3, the odd lane row i0 + 8 at col0 - 2 .. col0 + 1 (16-byte
// aligned: head_dim % 8 == 0 and the accumulator is 256-byte aligned). Rows past seq and columns
// past head_dim are not added.
template <int kNq>
__device__ __forceinline__ void add_dq_atomic(const float (&dqa)[kNq / 2], float* dq_acc, const AttentionParams& p,
                                              int64_t b, int64_t h, int64_t q0, int n0, int warp, int lane) {
  const int hd = int(p.head_dim), col0 = 2 * (lane & 3);
  const bool odd = lane & 1;
  const int64_t i = q0 + 16 * (warp & 3) + (lane >> 2) + (odd ? 8 : 0);
  float* row = dq_acc + ((b * p.seq + i) * p.heads + h) * p.head_dim;
#pragma unroll
  for (int n = 0; n < kNq / 8; ++n) {
    const float* a = dqa + 4 * n;
    const float x = __shfl_xor_sync(0xffffffffu, odd ? a[0] : a[2], 1);
    const float y = __shfl_xor_sync(0xffffffffu, odd ? a[1] : a[3], 1);
    const int col = n0 + n * 8 + col0 - (odd ? 2 : 0);
    if (i < p.seq && col < hd)
      atomicAdd(reinterpret_cast<float4*>(row + col), odd ? make_float4(x, y, a[2], a[3]) : make_float4(a[0], a[1], x, y));
  }
}

// The epilogue: dK (times scale) and dV rows j0 and j0 + 8 of kv head g, kN columns from c0, as
// bf16 into [batch, seq, kv_heads, head_dim]; rows past seq and columns past head_dim are skipped.
template <int kN>
__device__ __forceinline__ void store_dkv(const float (&dka)[kN / 2], const float (&dva)[kN / 2],
                                          const AttentionParams& p, int64_t b, int64_t g, int64_t j0, int c0,
                                          int col0, bf16* __restrict__ dk, bf16* __restrict__ dv) {
  const int64_t kv_stride = p.kv_heads * p.head_dim;
  const int hd = int(p.head_dim);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = j0 + 8 * r;
    if (j >= p.seq) continue;
#pragma unroll
    for (int n = 0; n < kN / 8; ++n) {
      const int col = c0 + n * 8 + col0;
      if (col >= hd) continue;
      const int64_t off = (b * p.seq + j) * kv_stride + g * p.head_dim + col;
      *reinterpret_cast<__nv_bfloat162*>(dk + off) =
          __floats2bfloat162_rn(dka[4 * n + 2 * r] * p.scale, dka[4 * n + 2 * r + 1] * p.scale);
      *reinterpret_cast<__nv_bfloat162*>(dv + off) = __floats2bfloat162_rn(dva[4 * n + 2 * r], dva[4 * n + 2 * r + 1]);
    }
  }
}

}  // namespace loom::cuda::flash::sm90
