// The warp-specialised flash backward's producer and dQ-writer warps (flash_attention_bwd_sm90_ws.cu
// at head_dim <= 128, flash_attention_bwd_sm90_ws_d256.cu above): the items a block walks, the TMA
// loads of each item's stage, and the tensor reductions of the consumers' dQ tiles. The barrier
// protocol is the one those files describe.
#pragma once
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/flash_sm90_pipeline.cuh"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/tma_mbarrier.cuh"

namespace loom::cuda::flash::ws {

// The warp-specialised backward's mbarriers in a block's shared array of kCount (the protocol in
// flash_attention_bwd_sm90_ws.cu): K and V landed, and read no more (the 8 consumer warps, before a
// block's second key tile); per stage full (the producer warp's 32 lanes) and
// empty (the 8 consumer warps), for Q with its rows' lse and for dO with their D apart, so that dO's
// buffer goes back once dV has read it while dK still reads Q; per consumer its dQ tile written (its
// 128 threads) and read (the writer).
template <int kStages>
struct Barriers {
  static constexpr int kCount = 2 + 4 * kStages + 4;
  uint64_t *kv, *kv_empty, *full_q, *empty_q, *full_do, *empty_do, *dq_full, *dq_empty;
  __device__ __forceinline__ explicit Barriers(uint64_t* bars)
      : kv(bars),
        kv_empty(bars + 1),
        full_q(bars + 2),
        empty_q(full_q + kStages),
        full_do(empty_q + kStages),
        empty_do(full_do + kStages),
        dq_full(empty_do + kStages),
        dq_empty(dq_full + 2) {}
  // By one thread; a __syncthreads must follow before any other thread uses them.
  __device__ __forceinline__ void init() const {
    tma::mbar_init(kv, 1);
    tma::mbar_init(kv_empty, 8);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      tma::mbar_init(&full_q[s], 32);
      tma::mbar_init(&empty_q[s], 8);
      tma::mbar_init(&full_do[s], 32);
      tma::mbar_init(&empty_do[s], 8);
    }
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      tma::mbar_init(&dq_full[c], 128);
      tma::mbar_init(&dq_empty[c], 1);
    }
    tma::mbar_init_fence();
  }
};

// A consumer at its block's second key tile: the first tile's dK and dV (kN columns from c0, rows
// j0 and j0 + 8) out and their accumulators zeroed, K and V's shared memory handed back (kv_empty: each
// warp once every product reading them has completed) and the second tile's K and V waited for.
template <int kN, int kStages>
__device__ __forceinline__ void next_key_tile(float (&dka)[kN / 2], float (&dva)[kN / 2], const AttentionParams& p,
                                              int b, int g, int j0, int c0, int col0, bf16* dk, bf16* dv,
                                              const Barriers<kStages>& bar, int lane) {
  sm90::store_dkv<kN>(dka, dva, p, b, g, j0, c0, col0, dk, dv);
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) dka[i] = dva[i] = 0.f;
  __syncwarp();
  if (lane == 0) tma::mbar_arrive(bar.kv_empty);
  tma::mbar_wait(bar.kv, 1);
}

// A block's items: for the kBc keys of key tile kt0 of kv head g, the query tiles of kBr rows that
// can see some of them (from kt0 kBc / kBr up to the last key's window, or seq), for every query head
// of the group: the last query tile first, each tile for the group's heads in turn; then, where the
// block has a second key tile kt1 (causal, no window: the pairing of launch_ws_bwd), that tile's
// items likewise. Blocks of the other key tiles of the same kv head that run at the same time then
// read the same Q and dO rows and add to the same dQ rows at about the same time, while those are
// still in L2. Item n belongs to the second tile from `split` on.
template <int kBr, int kBc>
struct Items {
  int g, group, qt_end, split, count, kt0, kt1;
  __device__ __forceinline__ Items(const AttentionParams& p, int kt0_, int kt1_, int g_)
      : g(g_), group(int(p.heads / p.kv_heads)), kt0(kt0_), kt1(kt1_) {
    const int seq = int(p.seq), window = int(p.window), key0 = kt0 * kBc;
    const int q_end = window > 0 && int64_t(key0) + kBc - 1 + window < seq ? key0 + kBc - 1 + window : seq;
    qt_end = (q_end + kBr - 1) / kBr;  // the same for both tiles: a second one comes only without a window
    split = group * (qt_end - key0 / kBr);  // >= group: key0 < seq
    count = kt1 >= 0 ? split + group * (qt_end - kt1 * kBc / kBr) : split;
  }
  __device__ __forceinline__ int local(int item) const { return item < split ? item : item - split; }
  __device__ __forceinline__ int head(int item) const { return g * group + local(item) % group; }
  __device__ __forceinline__ int start(int item) const { return (qt_end - 1 - local(item) / group) * kBr; }
  __device__ __forceinline__ int k0(int item) const { return (item < split ? kt0 : kt1) * kBc; }
};

// A block's kv head g, batch row b and key tiles kt0 and kt1 (-1: none), as launch_grid lays them
// out: with a window one tile a block (x kv head, y batch row, z key tile); causal without one tiles
// t and n - 1 - t (x the pair, y kv head, z batch row), so that every block has about as many items
// and blocks can go kv head by kv head without a long one starting last, the blocks running at once
// then sharing few heads' Q, dO and dQ rows in L2.
struct BlockTiles {
  int g, b, kt0, kt1;
};
template <int kBc>
__device__ __forceinline__ BlockTiles block_tiles(const AttentionParams& p) {
  const int n_tiles = (int(p.seq) + kBc - 1) / kBc;
  const bool paired = int(p.window) <= 0;
  const int kt0 = int(paired ? blockIdx.x : blockIdx.z);
  return {int(paired ? blockIdx.y : blockIdx.x), int(paired ? blockIdx.z : blockIdx.y), kt0,
          paired && n_tiles - 1 - kt0 != kt0 ? n_tiles - 1 - kt0 : -1};
}
template <int kBc>
inline dim3 launch_grid(const AttentionParams& p) {
  const unsigned tiles = unsigned((p.seq + kBc - 1) / kBc);
  return p.window > 0 ? dim3(unsigned(p.kv_heads), unsigned(p.batch), tiles)
                      : dim3((tiles + 1) / 2, unsigned(p.kv_heads), unsigned(p.batch));
}

// The producer warp: K and V of the block once (kD / 64 boxes each, on bar_kv), then per item n its
// dO with D (full_do, after empty_do), then its Q with lse times log2 e (+inf past seq: P = 0 there;
// full_q, after empty_q) into stage n % kStages, the lanes writing lse and D (loaded before the
// waits). dO goes first: consumers hand its buffer back before Q's.
template <int kBr, int kBc, int kD, int kStages>
__device__ __forceinline__ void produce(const CUtensorMap* map_q, const CUtensorMap* map_k, const CUtensorMap* map_v,
                                        const CUtensorMap* map_do, const AttentionParams& p, const float* lse,
                                        const float* dsum, bf16* sK, bf16* sV, bf16* sQ0, bf16* sdO0, float* sStat0,
                                        const Barriers<kStages>& bar, const Items<kBr, kBc>& items, int b, int lane) {
  constexpr int kBlocks = kD / 64;
  constexpr uint32_t kKvBytes = 2 * kBc * kD * sizeof(bf16), kTileBytes = kBr * kD * sizeof(bf16);
  const int seq = int(p.seq);
  // Q and dO rows are read again by the blocks of the other key tiles; K and V by no other block.
  const uint64_t keep = tma::l2_evict_last(), drop = tma::l2_evict_first();
  auto load_kv = [&](int k0) {
    if (lane == 0) {
      tma::mbar_arrive_expect_tx(bar.kv, kKvBytes);
#pragma unroll
      for (int c = 0; c < kBlocks; ++c) {
        tma::copy_4d(sK + c * kBc * 64, map_k, bar.kv, 64 * c, items.g, k0, b, drop);
        tma::copy_4d(sV + c * kBc * 64, map_v, bar.kv, 64 * c, items.g, k0, b, drop);
      }
    }
  };
  if (lane == 0) {
    tma::prefetch_tensormap(map_q);
    tma::prefetch_tensormap(map_do);
  }
  load_kv(items.kt0 * kBc);
  // One operand's stage: the lanes' kBr / 32 values each into stat, then lane 0 the tile's boxes.
  auto fill = [&](uint64_t* full, const CUtensorMap* map, bf16* tile, float* stat, const float (&v)[kBr / 32], int h,
                  int q0) {
#pragma unroll
    for (int i = 0; i < kBr / 32; ++i) stat[lane + 32 * i] = v[i];
    if (lane == 0) {
      tma::mbar_arrive_expect_tx(full, kTileBytes);
#pragma unroll
      for (int c = 0; c < kBlocks; ++c) tma::copy_4d(tile + c * kBr * 64, map, full, 64 * c, h, q0, b, keep);
    } else {
      tma::mbar_arrive(full);
    }
  };
#pragma unroll 1
  for (int n = 0; n < items.count; ++n) {
    const int s = n % kStages;
    const uint32_t free_parity = uint32_t((n / kStages) & 1) ^ 1u;
    const int h = items.head(n), q0 = items.start(n);
    const int64_t row = (int64_t(b) * p.heads + h) * p.seq;
    float l2[kBr / 32], dd[kBr / 32];
#pragma unroll
    for (int i = 0; i < kBr / 32; ++i) {
      const int r = lane + 32 * i;
      const bool ok = q0 + r < seq;
      l2[i] = ok ? lse[row + q0 + r] * kLog2e : INFINITY;
      dd[i] = ok ? dsum[row + q0 + r] : 0.f;
    }
    float* stat = sStat0 + s * 2 * kBr;
    tma::mbar_wait(&bar.empty_do[s], free_parity);
    fill(&bar.full_do[s], map_do, sdO0 + s * kBr * kD, stat + kBr, dd, h, q0);
    tma::mbar_wait(&bar.empty_q[s], free_parity);
    fill(&bar.full_q[s], map_q, sQ0 + s * kBr * kD, stat, l2, h, q0);
    if (n == items.split && n < items.count) {  // the second key tile's K and V, once the first's are read
      tma::mbar_wait(bar.kv_empty, 0);
      load_kv(items.kt1 * kBc);
    }
  }
}

// The dQ writer (one thread): per item, consumer c's tile (sdQ + c kBr kNq: kNq / kDqBox boxes) is
// added to dq_acc from column kNq c once dq_full[c] says it is written; both consumers' reductions go
// out before either is waited for, then dq_empty[c] once read. With kSplitK (each consumer's dQ over
// its own keys, all columns) the second consumer has added its partial sum into the first's tile:
// one tile an item, on dq_full[0] and dq_empty[0], half the reduction traffic to L2. Rows past seq
// and boxes past head_dim lie outside the map and are skipped (a tile's first box starts inside
// head_dim: column kNq c < head_dim for both kernels' widths).
template <int kBr, int kBc, int kNq, bool kSplitK>
__device__ __forceinline__ void write_dq(const CUtensorMap* map_dq, const float* sdQ, uint64_t* dq_full,
                                         uint64_t* dq_empty, const Items<kBr, kBc>& items, int hd, int b) {
  constexpr int kTiles = kSplitK ? 1 : 2;
  tma::prefetch_tensormap(map_dq);
  const uint64_t keep = tma::l2_evict_last();  // the other key tiles' blocks add to the same rows
#pragma unroll 1
  for (int n = 0; n < items.count; ++n) {
    const int h = items.head(n), q0 = items.start(n);
#pragma unroll
    for (int c = 0; c < kTiles; ++c) {
      tma::mbar_wait(&dq_full[c], uint32_t(n & 1));
      const float* tile = sdQ + c * kBr * kNq;
      const int n0 = kNq * c;  // inside head_dim for every caller: the first box always goes
      tma::reduce_add_4d(map_dq, tile, n0, h, q0, b, keep);
#pragma unroll
      for (int x = 1; x < kNq / sm90::kDqBox; ++x)
        if (n0 + sm90::kDqBox * x < hd)
          tma::reduce_add_4d(map_dq, tile + x * kBr * sm90::kDqBox, n0 + sm90::kDqBox * x, h, q0, b, keep);
      tma::bulk_commit();
    }
    if constexpr (kTiles == 2) {
      tma::bulk_wait_read<1>();  // consumer 0's tile has been read
      tma::mbar_arrive(&dq_empty[0]);
    }
    tma::bulk_wait_read<0>();
    tma::mbar_arrive(&dq_empty[kTiles - 1]);
  }
  tma::bulk_wait_all<false>();
}

}  // namespace loom::cuda::flash::ws
