// Flash attention forward on Hopper, warp-specialised (Kernel::kSm90Ws, the default where it applies;
// Kernel::kSm90WsPersistent, the same kernel launched persistent). The FlashAttention-3 scheme,
// written for Loom's layouts; causal attention with or without a window (no soft-cap or segments:
// the dispatcher sends those to the sm90 kernel), head_dim 64 to 256. A window starts each query
// tile's keys at the tile holding its first row's first visible key.
//
// Work item = (64 kC query rows, head, batch row), numbered with heads fastest, then batch rows, then
// query tiles from the last (the longest causal rows first; with three consumers the tiles are
// counted back from seq, ws_tiles_from_end). A consumer computes only the key tiles its own 64 rows
// can see (t_stop): past them it waits for each tile, hands it back and passes its turn. A block of kC + 1 warpgroups
// takes item blockIdx.x when the grid has a block per item (sm90_ws), or, with one block per SM
// (sm90_ws_persistent), walks items: the producer loads the next item's first keys and Q while the
// consumers finish the last one's products and write it, instead of a new block starting cold. A
// persistent block walks items round robin (blockIdx.x, blockIdx.x + gridDim.x, ...) or, where that
// measured slower (ws_dynamic_pays), takes its next item from a counter in global memory as it nears
// the end of the last (FlashAttention-3's dynamic scheduler): in a simulation of the causal items'
// lengths (key tiles + 1 an item, 132 SMs), round robin over items ordered longest first gave the
// busiest SM 152 units against greedy claiming's 148 at b4 s2048 d128, 552 against 521 at b1 s8192.
// Dynamic, the Q thread claims the items and publishes them in a
// shared-memory ring of kRing (ring_full / ring_empty barriers) that the K/V producer and the
// consumers read in the same order.
//   warpgroup 0, producers: setmaxnreg down to 24 registers; one thread (warp 0) issues TMA tensor
//     copies (128-byte swizzle, the wgmma::sw128 layout) of each item's key tiles' K and V (K one
//     tile ahead: K(0), K(1), V(0), K(2), V(1), ...) into a ring of kStages stages per operand, each
//     stage guarded by a full and an empty mbarrier; the ring runs on across items. Another (warp 1)
//     loads each item's Q into its buffer as soon as that is free, so Q never waits behind the
//     ring's stalls.
//   warpgroups 1 .. kC, consumers (64 query rows each): setmaxnreg up to 240 (kC = 2, head_dim 128
//     and 256) or 160 (kC = 3, head_dim 64: FlashAttention-3's 192-row tiles there); S = Q K^T and
//     O += P V with wgmma (Q, K, V from shared memory, P from registers), online softmax as in
//     the sm90 kernel, S(t+1) issued together with P(t) V(t) so that the softmax of tile t overlaps the
//     tensor cores within a warpgroup. The epilogue writes O / l as bf16 over the consumer's own
//     rows of Q (read by nothing else once its last S is done) and one thread stores the tile with
//     TMA: thread stores of two bf16 each filled half of every 32-byte sector they wrote and held
//     the consumers about 9 % of their time (Nsight Compute, H100, b4 s2048 d128).
// Pipeline: kStages = 2 stages of K and V tiles of 128 keys, and kQStages = 2 Q buffers where they
// fit (item k's Q in buffer k % kQStages): the producer loads the next item's Q while the consumers
// work on this one, instead of after (with one buffer every item started with a wait for its Q).
// Shared memory at head_dim 128: 2 x Q 32 KB + 2 x (K 32 KB + V 32 KB) = 192 KB (+ 1 KB alignment
// slack); at head_dim 64 2 x Q 24 KB (192 rows) + 2 x (16 + 16 KB) = 112 KB. Head dims 129 to 256
// run the 256-wide kernel (the TMA boxes past the row read zeros) with key tiles of 80,
// FlashAttention-3's choice there, and one Q buffer: Q 64 KB + 2 x (K 40 KB + V 40 KB) = 224 KB,
// and a consumer thread holds O (128 registers), S (40) and P (20). With one buffer, as
// FlashAttention-3 does, Q is handed back once the item's last S has completed, so the next item's Q
// loads during the last softmax and P V, and O leaves from registers (16-byte stores, whole sectors)
// instead of through Q's rows, which by then hold the next item's Q.
// Barrier protocol (key tile n counts the block's key tiles over all its items):
//   full_k[s], full_v[s] (count 1): the producer's arrive.expect_tx(tile bytes); TMA completes the
//     transactions. Key tile n uses stage n % kStages and phase parity (n / kStages) & 1.
//   empty_k[s], empty_v[s] (count 4 kC: one arrival per consumer warp) once the wgmma reading the stage
//     has completed (K after S(t) is waited for, V after P(t) V(t) is). The producer waits on them
//     with the opposite parity, so its first pass through the ring does not wait.
//   bar_q[qs] (count 1): the block's k-th item's Q landed in buffer qs = k % kQStages (parity
//     (k / kQStages) & 1). Two buffers: empty_q[qs] (count kC: each consumer's thread 0) once the
//     consumer's O tile of that item, written over its rows of Q, has been read by its TMA store
//     (checked after the next item's first S, so the store overlaps that product). One buffer:
//     empty_q[0] (count 4 kC: each consumer warp) once the item's last S has completed. The producer
//     waits for it (the opposite parity) before loading item k + kQStages's Q over it.
//   Named barriers 4 .. 3 + kC (128 threads; two Q buffers): consumer c's O tile is in shared memory.
//   Named barriers 1 .. kC (256 threads): consumer c's turn to issue its wgmma batch. A consumer
//     syncs on its own barrier, issues, then arrives on the next one's (c + 1 mod kC); the last
//     consumer arrives once on consumer 0's at the start (0 goes first) and consumer 0 syncs once
//     more at the end (consuming the last one's final arrival). All take the same items and key
//     tiles, so the turns go round across items too. One warpgroup's softmax runs while the others'
//     products occupy the tensor cores (ping-pong).
#include <cudaTypedefs.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/flash_mask.cuh"
#include "kernels/cuda/flash_sm90_pipeline.cuh"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/tma_mbarrier.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace loom::cuda::flash {
namespace {

using wgmma::Wgmma;

// kC consumer warpgroups of 64 query rows each: the block's threads and query rows, and the
// consumers' registers (128 x 24 + kC x 128 x regs <= 64 K registers: 240 for two, 160 for three).
template <int kC>
constexpr int ws_threads() {
  return 128 * (kC + 1);
}
template <int kC>
constexpr int ws_br() {
  return 64 * kC;
}
// Three consumers: query tiles of 192 rows end at seq (rounded up to 64) and are counted back from
// there, so that where 192 does not divide seq the rows before 0 fall in the shortest item (one or two
// key tiles) rather than rows past seq in the longest (a third of its products, measured 5.7 % of
// the d64 forward at b4 s2048; H200, session 59). Those rows are whole consumers' 64: Q loads in a
// box per consumer, none for them (no negative coordinates), and their O is not stored. Two
// consumers (128 rows, which divide the usual lengths) keep tiles from row 0 and one box of 128 rows:
// four 64-row boxes instead of two cost the d256 forward 5 % (one Q buffer, the next item's Q
// loading in the last key tile's shadow).
template <int kC>
constexpr bool ws_tiles_from_end() {
  return kC == 3;
}
template <int kC>
constexpr int ws_q_box() {
  return ws_tiles_from_end<kC>() ? 64 : ws_br<kC>();
}
constexpr int kProducerRegs = 24;
template <int kC>
constexpr int ws_consumer_regs() {
  return kC == 2 ? 240 : 160;
}
constexpr int kTurnBar0 = 1;   // named barriers 1 .. kC (0 is __syncthreads)
constexpr int kStoreBar0 = 4;  // 4 .. 3 + kC: consumer c's O tile is in shared memory
// Items a block's roles may be apart: the Q thread claims and publishes them, the K/V producer and
// the consumers take them in the same order.
constexpr int kRing = 4;

// Q buffers: two where they fit beside the K and V ring (head_dim 64 and 128), so that the producer
// loads the next item's Q while the consumers still read this one's; one at head_dim 256.
constexpr size_t kMaxSmem = 227 * 1024;
template <int kD, int kBc, int kStages, int kC, int kQStages>
constexpr size_t ws_smem_with() {
  return size_t(kQStages * ws_br<kC>() + 2 * kStages * kBc) * kD * sizeof(bf16) + 1024;  // + slack to align to 1024 bytes
}
template <int kD, int kBc, int kStages, int kC>
constexpr int ws_q_stages() {
  return ws_smem_with<kD, kBc, kStages, kC, 2>() <= kMaxSmem ? 2 : 1;
}
template <int kD, int kBc, int kStages, int kC>
constexpr size_t ws_smem() {
  return ws_smem_with<kD, kBc, kStages, kC, ws_q_stages<kD, kBc, kStages, kC>()>();
}

template <int kD, int kBc, int kStages, int kC>
__global__ void __launch_bounds__(ws_threads<kC>(), 1)
    flash_fwd_sm90_ws_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                             const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_o,
                             AttentionParams p, bf16* __restrict__ out, float* __restrict__ lse,
                             int* __restrict__ sched) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(kC == 2 || kC == 3, "two or three consumer warpgroups");
  constexpr int kBr = ws_br<kC>(), kNs = kBc / 8, kNo = kD / 8, kBlocks = kD / 64;  // 64-column blocks per row
  constexpr int kQStages = ws_q_stages<kD, kBc, kStages, kC>();
  constexpr uint32_t kTileBytes = kBc * kD * sizeof(bf16), kQBytes = kBr * kD * sizeof(bf16);
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[2 * kQStages + 4 * kStages];
  uint64_t* bar_q = bars;  // Q buffer qs: bar_q[qs], empty_q[qs]
  uint64_t* empty_q = bars + kQStages;
  uint64_t* full_k = bars + 2 * kQStages;
  uint64_t* full_v = full_k + kStages;
  uint64_t* empty_k = full_v + kStages;
  uint64_t* empty_v = empty_k + kStages;
  // The block's items in the order it takes them (see kRing): ring_item[k % kRing] is its k-th.
  __shared__ int ring_item[kRing];
  __shared__ __align__(8) uint64_t ring_full[kRing], ring_empty[kRing];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
  bf16* sK0 = sQ + kQStages * kBr * kD;  // Q buffer qs at sQ + qs * kBr * kD
  bf16* sV0 = sK0 + kStages * kBc * kD;  // stage s of K / V at sK0 / sV0 + s * kBc * kD

  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, wg = wgmma::warpgroup();
  const int q_tiles = int((p.seq + kBr - 1) / kBr), heads = int(p.heads), group = int(p.heads / p.kv_heads);
  const int items = q_tiles * heads * int(p.batch);
  struct Item {
    int h, b;
    int64_t q0;
    int t_begin, t_end;  // key tiles [t_begin, t_end) can be seen (t_end > t_begin)
  };
  auto item_at = [&](int i) {
    Item it;
    it.h = i % heads;
    it.b = (i / heads) % int(p.batch);
    // The longest causal rows first; three consumers: tiles counted back from seq rounded up to 64
    // (ws_tiles_from_end: q0 a multiple of 64, > -kBr).
    const int64_t tile = i / (heads * int(p.batch));
    it.q0 = ws_tiles_from_end<kC>() ? (p.seq + 63) / 64 * 64 - (tile + 1) * kBr : (q_tiles - 1 - tile) * kBr;
    const int64_t k_end = it.q0 + kBr < p.seq ? it.q0 + kBr : p.seq;  // keys [k_begin, k_end)
    const int64_t k_begin = p.window > 0 && it.q0 - p.window + 1 > 0 ? it.q0 - p.window + 1 : 0;
    it.t_begin = int(k_begin / kBc);
    it.t_end = int((k_end + kBc - 1) / kBc);
    return it;
  };
  // Persistent launches take items from the counters at sched; one block per item, or no counters, go
  // round robin (blockIdx.x, blockIdx.x + gridDim.x, ...).
  const bool dynamic = sched != nullptr && int(gridDim.x) < items;
  // The block's pass-th item (items or more: none left). Dynamic: as the Q thread published it, the
  // K/V producer (alone) or each consumer warp handing the ring's slot back once it has read it.
  auto take_item = [&](int pass, bool alone) {
    if (!dynamic) return int(blockIdx.x) + pass * int(gridDim.x);
    const int r = pass % kRing;
    tma::mbar_wait(&ring_full[r], uint32_t((pass / kRing) & 1));
    const int i = ring_item[r];
    if (!alone) __syncwarp();
    if (alone || (threadIdx.x & 31) == 0) tma::mbar_arrive(&ring_empty[r]);
    return i;
  };

  if (tid == 0) {
#pragma unroll
    for (int qs = 0; qs < kQStages; ++qs) {
      tma::mbar_init(&bar_q[qs], 1);
      // Two buffers: each consumer's thread 0, once its O tile has left the buffer. One: each consumer
      // warp, once its item's last S has completed (O then goes out from registers).
      tma::mbar_init(&empty_q[qs], kQStages > 1 ? kC : 4 * kC);
    }
#pragma unroll
    for (int r = 0; r < kRing; ++r) {
      tma::mbar_init(&ring_full[r], 1);
      tma::mbar_init(&ring_empty[r], 1 + 4 * kC);  // the K/V producer and each consumer warp
    }
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      tma::mbar_init(&full_k[s], 1);
      tma::mbar_init(&full_v[s], 1);
      tma::mbar_init(&empty_k[s], 4 * kC);
      tma::mbar_init(&empty_v[s], 4 * kC);
    }
    tma::mbar_init_fence();
  }
  __syncthreads();  // the last block-wide barrier: the producer's idle warps leave below

  if (wg == 0) {  // ---- producers ----
    tma::regs_dec<kProducerRegs>();
    if (tid == 0) {  // K and V
      tma::prefetch_tensormap(&map_k);
      tma::prefetch_tensormap(&map_v);
      auto load = [&](const CUtensorMap* map, bf16* tiles, uint64_t* full, uint64_t* empty, int n, int t, int g, int b) {
        const int s = n % kStages;
        tma::mbar_wait(&empty[s], uint32_t((n / kStages) & 1) ^ 1u);  // a fresh barrier passes parity 1
        tma::mbar_arrive_expect_tx(&full[s], kTileBytes);
#pragma unroll
        for (int c = 0; c < kBlocks; ++c)
          tma::copy_4d(tiles + s * kBc * kD + c * kBc * 64, map, &full[s], 64 * c, g, t * kBc, b);
      };
      int n0 = 0;  // the item's first key tile in the block's count
      for (int pass = 0;; ++pass) {
        const int i = take_item(pass, true);
        if (i >= items) break;
        const Item it = item_at(i);
        const int g = it.h / group;
        load(&map_k, sK0, full_k, empty_k, n0, it.t_begin, g, it.b);
        // K runs one tile ahead of V (K(t + 1) before V(t)): the consumers need K(t + 1) and V(t)
        // at the same step, and K(t + 1)'s stage is freed a step earlier than V(t)'s.
        for (int t = it.t_begin; t < it.t_end; ++t) {
          const int n = n0 + t - it.t_begin;
          if (t + 1 < it.t_end) load(&map_k, sK0, full_k, empty_k, n + 1, t + 1, g, it.b);
          load(&map_v, sV0, full_v, empty_v, n, t, g, it.b);
        }
        n0 += it.t_end - it.t_begin;
      }
    } else if (tid == 32) {  // the block's items, and their Q as soon as its buffer is free: up to kQStages items ahead
      tma::prefetch_tensormap(&map_q);
      // Dynamic: the block's pass-th item, claimed and published for the other roles as soon as the
      // item before it has its Q loads issued, before the wait for its buffer (the K/V producer runs
      // up to two key tiles ahead of the consumers, so on short items it needs the next item early).
      // Claiming after that wait instead measured the same (H100, session 56).
      auto publish = [&](int pass, int i) {
        const int r = pass % kRing;
        tma::mbar_wait(&ring_empty[r], uint32_t((pass / kRing) & 1) ^ 1u);
        ring_item[r] = i;
        tma::mbar_arrive(&ring_full[r]);  // release: the other roles read ring_item[r] after their wait
      };
      for (int pass = 0;; ++pass) {
        const int qs = pass % kQStages;
        const int i = !dynamic ? take_item(pass, true)
                      : pass == 0 ? int(blockIdx.x)
                                  : atomicAdd(sched, 1) + int(gridDim.x);  // counts from 0: the grid took items [0, gridDim.x)
        if (dynamic) publish(pass, i);
        if (i >= items) break;
        tma::mbar_wait(&empty_q[qs], uint32_t((pass / kQStages) & 1) ^ 1u);
        const Item it = item_at(i);
        // Boxes of kBox rows, none for rows before 0 (no negative coordinates: ws_tiles_from_end).
        constexpr int kBox = ws_q_box<kC>(), kBoxes = kBr / kBox;
        const int first = it.q0 < 0 ? int(-it.q0 / kBox) : 0;
        tma::mbar_arrive_expect_tx(&bar_q[qs], kQBytes / kBoxes * (kBoxes - first));
#pragma unroll
        for (int c = 0; c < kBlocks; ++c)
          for (int r = first; r < kBoxes; ++r)
            tma::copy_4d(sQ + (qs * kBlocks + c) * kBr * 64 + r * kBox * 64, &map_q, &bar_q[qs], 64 * c, it.h,
                         int(it.q0) + kBox * r, it.b);
      }
      if (dynamic) {  // every block's last claim is made: the last block resets the counters for the next launch
        __threadfence();
        if (atomicAdd(sched + 1, 1) == int(gridDim.x) - 1) {
          atomicExch(sched, 0);
          atomicExch(sched + 1, 0);
        }
      }
    }
    return;  // the copies complete on the full barriers, which the consumers wait for before exiting
  }

  // ---- consumers ----
  tma::regs_inc<ws_consumer_regs<kC>()>();
  const int cw = wg - 1;  // consumer 0 .. kC - 1: query rows q0 + 64 cw ..
  const int my_turn = kTurnBar0 + cw, other_turn = kTurnBar0 + (cw + 1) % kC;
  auto release = [&](uint64_t* bar) {  // this warp's wgmma reading the stage have completed
    __syncwarp();
    if (lane == 0) tma::mbar_arrive(bar);
  };
  auto parity = [](int n) { return uint32_t((n / kStages) & 1); };
  const float scale_log2 = p.scale * kLog2e;
  const int col0 = 2 * (lane & 3);
  float sacc[kBc / 2], oacc[kD / 2];
  uint32_t pf[kBc / 16][4];

  if (cw == kC - 1) tma::named_arrive(kTurnBar0, 256);  // consumer 0 issues first
  const bool store_thread = (tid & 127) == 0;  // issues this consumer's O stores
  int out_qs = -1;  // the Q buffer whose rows still hold this consumer's last O tile on its way out
  int n0 = 0;  // as the producer's
#pragma unroll 1
  for (int pass = 0;; ++pass) {
    const int i = take_item(pass, false);
    if (i >= items) break;
    const Item it = item_at(i);
    const int64_t q0 = it.q0;
    const int t_begin = it.t_begin, t_end = it.t_end, qs = pass % kQStages;
    // This consumer's 64 rows see no key from tile t_stop on (causal: keys past its last row; at
    // least one tile is computed): those tiles it only waits for and hands back, and passes its turn,
    // so that the tensor cores go to the consumers whose rows see them.
    const int64_t my_keys = std::min<int64_t>(q0 + 64 * cw + 64, p.seq);
    const int t_stop = std::min(t_end, std::max(t_begin + 1, int((my_keys + kBc - 1) / kBc)));
    bf16* sQi = sQ + qs * kBr * kD;
    auto issue_s = [&](int n) {  // S = Q K^T for this warpgroup's 64 rows (issued, not waited for)
      sm90::issue_qk<kD, kBr, kBc>(sacc, sQi, sK0 + (n % kStages) * kBc * kD, 64 * cw);
    };
    auto masked = [&](int t) {  // tiles that reach past the block's first row, past seq or out of the window
      return classify(p, q0, kBr, int64_t(t) * kBc, kBc, 0, 0, 0, 0) == TileKind::kMasked;
    };
    // Prologue: S(t_begin).
    tma::mbar_wait(&bar_q[qs], uint32_t((pass / kQStages) & 1));
    tma::mbar_wait(&full_k[n0 % kStages], parity(n0));
#pragma unroll
    for (int j = 0; j < kBc / 2; ++j) sacc[j] = 0.f;
    issue_s(n0);
    wgmma::wait_regs<0>(sacc);
    release(&empty_k[n0 % kStages]);
    if (kQStages == 1 && t_stop - t_begin == 1) release(&empty_q[qs]);  // the item's only S: Q is read
    if (kQStages > 1 && out_qs >= 0) {  // the last item's O has been read out of its Q buffer: free it
      if (store_thread) {
        tma::bulk_wait_read<0>();
        tma::mbar_arrive(&empty_q[out_qs]);
      }
      out_qs = -1;
    }

    const int64_t row0 = q0 + 64 * cw + 16 * (warp & 3) + (lane >> 2);  // this thread's rows: row0, row0 + 8
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < kD / 2; ++j) oacc[j] = 0.f;
    bool is_masked = masked(t_begin);

#pragma unroll 1
    for (int t = t_begin; t < t_stop; ++t) {
      const int64_t k0 = int64_t(t) * kBc;
      const int n = n0 + t - t_begin, tn = t + 1;
      // (a) Mask and online softmax of S(t), in place (log2 units), while O += P(t-1) V(t-1) runs.
      if (is_masked) {  // rows past seq or before 0 are never written, and a valid row's key j <= i < seq
        if (p.window > 0) mask_causal_window<kNs>(sacc, int(row0 - k0) - col0, int(p.window));
        else mask_causal<kNs>(sacc, int(row0 - k0) - col0);
      }
      float corr[2];
      sm90::online_softmax<kNs>(sacc, m, l, corr, scale_log2);

      // (b) K(t+1) and V(t) have landed. These waits are spin loops, so they also end the basic block
      // of the softmax: without one here ptxas hoists the wait for O += P(t-1) V(t-1) below above
      // the exponentials, and the softmax no longer overlaps that product.
      if (tn < t_stop) tma::mbar_wait(&full_k[(n + 1) % kStages], parity(n + 1));
      tma::mbar_wait(&full_v[n % kStages], parity(n));
      // (c) O += P(t-1) V(t-1) has completed: O and P may be written, and V(t-1)'s stage is free.
      wgmma::wait_regs<0>(oacc);
      if (t > t_begin) release(&empty_v[(n - 1) % kStages]);
      sm90::pack_p<kNs>(pf, sacc);
      sm90::rescale_o<kNo>(oacc, corr);  // skipped by warps none of whose rows' maximum moved

      // This warpgroup's turn at the tensor cores.
      tma::named_sync(my_turn, 256);
      // (d) S(t+1) = Q K(t+1)^T, then (e) O += P(t) V(t): both in flight at once; the other
      // consumer's turn.
      if (tn < t_stop) issue_s(n + 1);
      const uint64_t dv = wgmma::tile_desc(sV0 + (n % kStages) * kBc * kD, kBc * 128);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) Wgmma<kD>::template rs<1>(oacc, pf[kk], wgmma::desc_mn_major<kBc>(dv, kk), 1);
      wgmma::commit();
      tma::named_arrive(other_turn, 256);
      // (f) S(t+1) is ready (the older group; a no-op when there is none) and K(t+1)'s stage is free;
      // O += P(t) V(t) may still run.
      wgmma::wait_regs<1>(sacc);
      if (tn < t_stop) {
        release(&empty_k[(n + 1) % kStages]);
        // One Q buffer: the item's last S has completed, so the next item's Q may load over this one
        // while the last softmax and P V run.
        if (kQStages == 1 && tn + 1 == t_stop) release(&empty_q[qs]);
        is_masked = masked(tn);
      }
    }
    // Once this wait returns the last P V has completed (its V stage is free) and so has the last
    // S. With two Q buffers this consumer's 64 rows of Q take its O tile on its way out (a TMA
    // store, which leaves out rows past seq and columns past head_dim), and the buffer is handed
    // back to the producer once the store has read it, after the next item's first S. With one
    // (head_dim 256) the buffer went back after the last S, so that the next item's Q loads during
    // the last softmax and P V, and O goes out from registers in 16-byte stores.
    wgmma::wait_regs<0>(oacc);
    release(&empty_v[(n0 + t_stop - t_begin - 1) % kStages]);
    // Key tiles past t_stop: nothing of them is visible to these rows. Each is waited for and handed
    // back, and the turn passed, so that the ring's counts and the turns go on as for the others.
#pragma unroll 1
    for (int n = n0 + t_stop - t_begin; n < n0 + t_end - t_begin; ++n) {
      tma::mbar_wait(&full_k[n % kStages], parity(n));
      release(&empty_k[n % kStages]);
      tma::mbar_wait(&full_v[n % kStages], parity(n));
      release(&empty_v[n % kStages]);
      tma::named_sync(my_turn, 256);
      tma::named_arrive(other_turn, 256);
    }
    if constexpr (kQStages == 1) {  // two consumers: tiles from row 0, no row before it
      sm90::store_rows_wide<kNo>(p, oacc, m, l, it.b, it.h, row0, lane, out, lse);
    } else {
      sm90::store_rows_tile<kNo, kBr>(p, oacc, m, l, it.b, it.h, row0, 64 * cw + 16 * (warp & 3) + (lane >> 2), col0,
                                      lane, sQi, lse);
      wgmma::fence_proxy_async();  // the tile's writes, visible to the copy engine
      tma::named_sync(kStoreBar0 + cw, 128);
      if (store_thread && q0 + 64 * cw >= 0) {
#pragma unroll
        for (int c = 0; c < kBlocks; ++c)
          tma::store_4d(&map_o, sQi + c * kBr * 64 + 64 * cw * 64, 64 * c, it.h, int(q0) + 64 * cw, it.b);
        tma::bulk_commit();
      }
    }
    if constexpr (kQStages > 1) out_qs = qs;
    n0 += t_end - t_begin;
  }
  if (store_thread) tma::bulk_wait_all<false>();  // the last O tile written before the block's memory goes
  if (cw == 0) tma::named_sync(kTurnBar0, 256);  // the last consumer's arrival after its last batch
#else
  __trap();  // built without sm_90a; forward_sm90_ws is never called then (sm90_ready())
#endif
}

// A persistent launch's item counters, [next item, blocks done]: one pair per (device, stream), so
// that launches that may run at once never share one. They are zero between launches (zero in a
// new module; the last block of a launch resets them). Beyond kSchedSlots streams on a device a
// launch goes round robin (nullptr). A CUDA graph replayed on another stream than it was captured on
// would keep the capture stream's counters (Loom captures none).
constexpr int kSchedSlots = 64, kSchedDevices = 64;
__device__ int g_sched[kSchedSlots][2];
int* schedule_counters(Stream s) {
  static std::mutex mu;
  static std::map<std::pair<int, Stream>, int*> slots;
  static int used[kSchedDevices] = {};
  int dev = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(dev, s);
  if (auto it = slots.find(key); it != slots.end()) return it->second;
  if (dev < 0 || dev >= kSchedDevices || used[dev] == kSchedSlots) return nullptr;
  void* base = nullptr;
  LOOM_CUDA_CHECK(cudaGetSymbolAddress(&base, g_sched));
  int* slot = static_cast<int*>(base) + 2 * used[dev]++;
  slots.emplace(key, slot);
  return slot;
}

template <int kD, int kBc, int kStages, int kC>
void launch_ws(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,
               int64_t blocks, TileOrder order, Stream s) {
  auto* kernel = flash_fwd_sm90_ws_kernel<kD, kBc, kStages, kC>;
  constexpr size_t kSmem = ws_smem<kD, kBc, kStages, kC>();
  constexpr int kBr = ws_br<kC>();
  const bool dynamic = blocks > 0 && (order == TileOrder::kDynamic || (order == TileOrder::kAuto && ws_dynamic_pays(p, kBr)));
  int* sched = dynamic ? schedule_counters(s) : nullptr;
  allow_dynamic_smem<flash_fwd_sm90_ws_kernel<kD, kBc, kStages, kC>>(kSmem);
  const CUtensorMap mq = tma::make_bshd_map(q, p.batch, p.seq, p.heads, p.head_dim, ws_q_box<kC>());
  const CUtensorMap mk = tma::make_bshd_map(k, p.batch, p.seq, p.kv_heads, p.head_dim, kBc);
  const CUtensorMap mv = tma::make_bshd_map(v, p.batch, p.seq, p.kv_heads, p.head_dim, kBc);
  const CUtensorMap mo = tma::make_bshd_map(out, p.batch, p.seq, p.heads, p.head_dim, 64);  // a consumer's 64 rows
  const int64_t items = (p.seq + kBr - 1) / kBr * p.heads * p.batch;
  LOOM_CHECK(items < (int64_t(1) << 31), "flash forward_sm90_ws: ", items, " query tiles do not fit an int");
  kernel<<<unsigned(blocks > 0 ? std::min(items, blocks) : items), ws_threads<kC>(), kSmem, s>>>(mq, mk, mv, mo, p, out, lse,
                                                                                                    sched);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace

// Rows at least one 64-column TMA box wide: a box wider than the tensor's row is not a shape the
// kernel has been run with (head_dim 32 and below go to the sm90 kernel).
bool sm90_ws_supported(const AttentionParams& p) {
  return p.softcap <= 0.f && p.segment_ids == nullptr && p.head_dim >= 64 && p.head_dim <= 256 &&
         p.head_dim % 8 == 0 && p.window < (int64_t(1) << 30) && p.seq < (int64_t(1) << 30);  // int positions
}

// Persistent forward, one block per SM, H100 (bench/results/session56, A/B against round robin in one
// call): dynamic b1 s8192 d128 0.972-0.978, b1 s32768 0.974-0.976, b4 s2048 h16/8 d256 0.976-0.982,
// b4 s2048 d64 0.990-0.999; but b4 s2048 d128 1.021-1.025 (its items of 1 to 3 key tiles, a sixth of
// them, may wait for a claim's round trip: not established). Dynamic above head_dim 128 and from 32
// query tiles a row.
bool ws_dynamic_pays(const AttentionParams& p, int64_t rows) {
  return p.head_dim > 128 || (p.seq + rows - 1) / rows >= 32;
}

void forward_sm90_ws(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,
                     Stream s, int64_t blocks, TileOrder order) {
  if (p.head_dim <= 64) launch_ws<64, 128, 2, 3>(p, q, k, v, out, lse, blocks, order, s);
  else if (p.head_dim <= 128) launch_ws<128, 128, 2, 2>(p, q, k, v, out, lse, blocks, order, s);
  else launch_ws<256, 80, 2, 2>(p, q, k, v, out, lse, blocks, order, s);
}

}  // namespace loom::cuda::flash

namespace loom::cuda::tma {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    LOOM_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
#else
    LOOM_CUDA_CHECK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found));
#endif
    LOOM_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr,
               "flash attention (sm_90a warp-specialised kernels): the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// [batch, seq, heads, head_dim] of `elem` bytes per element in boxes of box_cols x box_rows, 128-byte swizzle.
CUtensorMap make_bshd(CUtensorMapDataType type, size_t elem, void* base, int64_t batch, int64_t seq, int64_t heads,
                      int64_t head_dim, int box_cols, int box_rows) {
  const cuuint64_t row = cuuint64_t(head_dim) * elem;
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(heads), cuuint64_t(seq), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {row, row * cuuint64_t(heads), row * cuuint64_t(heads) * cuuint64_t(seq)};
  const cuuint32_t box[4] = {cuuint32_t(box_cols), 1, cuuint32_t(box_rows), 1}, elem_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r = tensor_map_encoder()(&map, type, 4, base, dims, strides, box, elem_strides,
                                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  LOOM_CHECK(r == CUDA_SUCCESS, "flash attention (sm_90a warp-specialised): cuTensorMapEncodeTiled failed (", int(r),
             ") for batch=", batch, " seq=", seq, " heads=", heads, " head_dim=", head_dim, " element bytes=", elem);
  return map;
}

}  // namespace

CUtensorMap make_bshd_map(const void* base, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int box_rows) {
  return make_bshd(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, sizeof(bf16), const_cast<void*>(base), batch, seq, heads, head_dim,
                   64, box_rows);
}

CUtensorMap make_bshd_map_f32(void* base, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int box_rows) {
  return make_bshd(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, sizeof(float), base, batch, seq, heads, head_dim, 32, box_rows);
}

CUtensorMap make_matrix_map(const void* base, int64_t cols, int64_t rows, int64_t ld, int64_t mats, int64_t mat_stride,
                            int box_cols, int box_rows) {
  const cuuint64_t e = sizeof(bf16);
  const cuuint64_t dims[3] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(mats)};
  const cuuint64_t strides[2] = {cuuint64_t(ld) * e, cuuint64_t(mat_stride) * e};
  const cuuint32_t box[3] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1}, elem_strides[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims,
                                          strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  LOOM_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (", int(r), ") for ", mats, " matrices of ", rows,
             " x ", cols, " bf16 (ld ", ld, ", matrix stride ", mat_stride, "), boxes of ", box_rows, " x ", box_cols);
  return map;
}

}  // namespace loom::cuda::tma
