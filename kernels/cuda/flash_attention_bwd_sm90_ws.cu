// Flash attention backward on Hopper, warp-specialised (Kernel::kSm90Ws): the FlashAttention-3
// scheme for Loom's layouts; causal attention with or without a window (no soft-cap or segments:
// backward() sends those to the sm90 kernel), head_dim <= 128 (a multiple of 8; 129..256 in
// flash_attention_bwd_sm90_ws_d256.cu).
//
// Block = 3 warpgroups (384 threads) per (kv head, batch row) and one or two key tiles of 128 keys.
// With a window, one tile a block, grid and key order as the sm90 kernel (flash_attention_bwd_sm90.cu).
// Causal without one, tiles t and n - 1 - t (of n) share a block, grid x walking the pairs of one kv
// head and batch row: every block then has about the same number of items, so the blocks go kv head
// by kv head without a long one starting last, and those running at once read and add to the rows of
// fewer heads, which stay in L2 (one tile a block, key tiles outermost: the longest first, every
// head at once; Nsight Compute, H100, b4 s2048 d128: L2 hit rate 56.7 -> 69.9 %, DRAM throughput 55.9
// -> 37.1 %, the backward 16 % faster). Items (ws::Items) = the query tiles of kBr = 64 rows that can
// see a tile's keys (from its first row's tile to the window's reach or seq), the last first, each for
// the group's query heads in turn; then the second tile's.
//   warpgroup 0: setmaxnreg down to 24 registers.
//     warp 0, producer: K and V of each key tile (TMA; the second once the consumers have done with
//       the first's), then per item dO and Q (TMA, 128-byte
//       swizzle = the wgmma::sw128 layout) into a ring of kStages stages, each with its own full and
//       empty barriers, D and lse written beside them by the warp's lanes (loaded from global memory
//       before the waits for the buffers to be free).
//     warp 1, dQ writer (lane 0): per item and consumer, tensor reductions (cp.reduce.async.bulk
//       .tensor add, f32 map of dq_acc) of the consumer's dQ tile in shared memory: two boxes of 64
//       rows x 32 columns, 128-byte swizzle. (Per-row bulk reductions were 128 copy-engine
//       operations per item, sharing the unit with the producer's Q and dO loads; the kernel then
//       took about as long per item at head_dim 64 as at 128.) At head_dim 64 one tile an item: the
//       two consumers' partial sums are added in shared memory first.
//   warpgroups 1 and 2, consumers (keys 64 c .. 64 c + 63 of the block): setmaxnreg up to 240; per
//     item S^T = K Q^T and dP^T = V dO^T (wgmma, shared operands), P^T in registers and at once dV +=
//     P^T dO (P^T from registers: it runs while dS^T is made), then dS^T = P^T (dP^T - D) in
//     registers and to shared memory; once the dS^T rows are in shared memory dQ = dS K (dS^T read
//     from shared memory) and dK += dS^T Q (dS^T from registers) go out together, dQ first, as
//     FlashAttention-3 orders them: dQ's tile is written for the writer while dK runs (issued last,
//     dQ and the tile's write-out held the consumers about 15 % of their time: ncu, H100, session
//     53). dO's buffer is handed back once dV and dQ are done, Q's once dK is. At head_dim 128 consumer c
//     takes dQ's columns 64 c .. 64 c + 63 over all 128 keys (so it needs the other consumer's dS^T), at head_dim 64
//     all columns over its own 64 keys (the writer adds both tiles). dK, dV stay in registers and
//     are written at the end of each key tile's items.
// Shared memory at head_dim 128: K, V 64 KB; Q, dO 2 stages x 32 KB (3 x 16 KB at head_dim 64); dS^T 2 x 16 KB (double
// buffered: a consumer writes item n's while the other may still read item n - 1's); dQ tiles
// 2 x 16 KB (at head_dim 64 only the first holds the consumers' sum; the second is left unused); lse, D 1 KB: 193 KB (+ 1 KB alignment slack).
// Barrier protocol (mbarrier phase n of a barrier used once per item has parity n & 1; a fresh
// barrier's "previous" phase, parity 1, counts as complete, so first-pass waits on empty barriers
// return at once):
//   bar_kv (count 1): K and V landed (expect_tx of both tiles); the second key tile's with parity 1.
//   kv_empty (count 8: one per consumer warp): the first key tile's products are all done, its dK and
//     dV stored; the producer then loads the second tile's K and V over them.
//   full_do[s], full_q[s] (count 32): the producer warp's lanes each arrive after writing their D
//     (lse) rows; lane 0's arrival carries expect_tx for the dO (Q) tile. Item n uses stage
//     n % kStages, parity (n / kStages) & 1. Consumers wait for both before S^T: a wait between the
//     S^T and dP^T groups makes ptxas complete S^T before it issues dP^T.
//   empty_do[s] (count 8: one per consumer warp) once the warp's dV (the last wgmma reading dO)
//     completed; empty_q[s] likewise after dK (the last reading Q). The producer waits with the
//     opposite parity, for dO's buffer first.
//   dq_full[c] (count 128): consumer c's threads wrote their dQ fragments (and fenced them to the
//     async proxy); the writer waits with parity n & 1.
//   dq_empty[c] (count 1): the writer's reductions have read consumer c's tile; the consumer waits
//     with parity (n & 1) ^ 1 before writing item n's. At head_dim 64 only dq_full[0] (consumer 1's
//     threads, once they added their dQ to consumer 0's) and dq_empty[0] (consumer 0 waits).
//   Named barrier kMergeBar (256 threads; head_dim 64): consumer 0 arrives once its dQ of item n is
//     in the tile, consumer 1 syncs before adding its own.
//   Named barrier kOwnBar + c (consumer c's 128 threads): its dS^T rows of the item are in shared
//     memory (all its four warps wrote them); dQ reads them (at head_dim 64 only those).
//   Named barriers kCrossBar + 2 c + (n & 1) (256 threads; head_dim 128): consumer c arrives once its
//     dS^T of item n is written, the other consumer syncs before its dQ reads all 128 keys. No
//     lockstep: the earlier consumer's dV runs while it waits.
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_bwd_ws.cuh"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/flash_sm90_pipeline.cuh"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/tma_mbarrier.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace loom::cuda::flash {
namespace {

using wgmma::Wgmma;

constexpr int kBr = 64, kBc = 128, kThreads = 384;
// Q/dO ring stages: three at head_dim 64 (shorter items, room to spare), two at 128 (194 KB).
template <int kD>
constexpr int ws_stages() {
  return kD == 64 ? 3 : 2;
}
constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 128 x 24 + 256 x 240 <= 64 K registers
// Named barriers: kOwnBar + c, consumer c's 128 threads; kCrossBar + 2 c + (n & 1), consumer c's
// dS^T of item n for the other consumer (head_dim 128).
// kMergeBar (head_dim 64): consumer 0's partial dQ of the item is in the tile, for consumer 1 to add to.
constexpr int kCrossBar = 1, kOwnBar = 5, kMergeBar = 7;

template <int kD>
constexpr size_t ws_bwd_smem() {
  constexpr int kStages = ws_stages<kD>();
  return size_t(2 * kBc + 2 * kStages * kBr) * kD * sizeof(bf16) + 2 * size_t(kBc) * kBr * sizeof(bf16) +
         2 * size_t(kBr) * 64 * sizeof(float) + kStages * 2 * kBr * sizeof(float) + 1024;
}

template <int kD>
__global__ void __launch_bounds__(kThreads, 1)
    flash_bwd_sm90_ws_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                             const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_do,
                             const __grid_constant__ CUtensorMap map_dq, AttentionParams p, const float* __restrict__ lse,
                             const float* __restrict__ dsum, bf16* __restrict__ dk, bf16* __restrict__ dv) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStages = ws_stages<kD>();
  constexpr bool kSplitK = kD == 64;          // dQ: each consumer its own keys, all columns
  constexpr int kNq = kSplitK ? kD : kD / 2;  // dQ columns per consumer
  static_assert(kNq == 64, "dQ column blocks start on a 64-column boundary");
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[ws::Barriers<kStages>::kCount];
  const ws::Barriers<kStages> bar(bars);
  uint64_t *full_q = bar.full_q, *empty_q = bar.empty_q, *full_do = bar.full_do, *empty_do = bar.empty_do,
           *dq_full = bar.dq_full, *dq_empty = bar.dq_empty;
  bf16* sK = reinterpret_cast<bf16*>(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
  bf16* sV = sK + kBc * kD;
  bf16* sQ0 = sV + kBc * kD;              // stage s at sQ0 + s * kBr * kD
  bf16* sdO0 = sQ0 + kStages * kBr * kD;  // likewise
  bf16* sdS0 = sdO0 + kStages * kBr * kD;  // dS^T [kBc keys][kBr queries], swizzled; buffer n % 2
  // Consumer c's dQ tile at sdQ + c * kBr * 64: two boxes of [kBr][sm90::kDqBox] f32, 128-byte swizzle.
  float* sdQ = reinterpret_cast<float*>(sdS0 + 2 * kBc * kBr);
  float* sStat0 = sdQ + 2 * kBr * 64;  // stage s: lse * log2 e [kBr], then D [kBr]

  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, wg = wgmma::warpgroup();
  const int seq = int(p.seq), hd = int(p.head_dim);
  const int window = int(p.window);
  const auto [g, b, kt0, kt1] = ws::block_tiles<kBc>(p);
  const ws::Items<kBr, kBc> items(p, kt0, kt1, g);
  const int n_items = items.count;

  if (tid == 0) bar.init();
  __syncthreads();  // the last block-wide barrier: warpgroup 0's idle warps leave below

  if (wg == 0) {
    tma::regs_dec<kProducerRegs>();
    if (warp == 0) {  // ---- producer ----
      ws::produce<kBr, kBc, kD, kStages>(&map_q, &map_k, &map_v, &map_do, p, lse, dsum, sK, sV, sQ0, sdO0, sStat0, bar, items, b,
                                         lane);
    } else if (warp == 1 && lane == 0) {  // ---- dQ writer ----
      ws::write_dq<kBr, kBc, kNq, kSplitK>(&map_dq, sdQ, dq_full, dq_empty, items, hd, b);
    }
    return;
  }

  // ---- consumers ----
  tma::regs_inc<kConsumerRegs>();
  const int cw = wg - 1;  // keys 64 cw .. 64 cw + 63 of the block
  // This thread's key rows (jl, jl + 8 within the block) and query columns (8 n + col0 + e % 2).
  const int jl = 64 * cw + 16 * (warp & 3) + (lane >> 2), col0 = 2 * (lane & 3);
  const float scale_log2 = p.scale * kLog2e;
  float dka[kD / 2], dva[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dka[i] = dva[i] = 0.f;
  uint32_t pt[kBr / 16][4];
  float* dq_tile = sdQ + cw * kBr * 64;

  tma::mbar_wait(bar.kv, 0);
  int k0 = kt0 * kBc;
#pragma unroll 1
  for (int n = 0; n < n_items; ++n) {
    if (n == items.split) {  // the block's second key tile: its first's dK and dV out, K and V anew
      ws::next_key_tile<kD>(dka, dva, p, b, g, k0 + jl, 0, col0, dk, dv, bar, lane);
      k0 = kt1 * kBc;
    }
    const int s = n % kStages, q0 = items.start(n);
    const bf16* cQ = sQ0 + s * kBr * kD;
    const bf16* cdO = sdO0 + s * kBr * kD;
    const float* cStat = sStat0 + s * 2 * kBr;
    bf16* cdS = sdS0 + (n & 1) * kBc * kBr;
    // Tiles on the diagonal, past seq or reaching out of the window need the mask (query i sees
    // key j <= i < seq, and i - j < window with one).
    const bool masked = q0 < k0 + kBc - 1 || q0 + kBr > seq || (window > 0 && q0 + kBr - 1 - k0 >= window);
    // Both before the first product: a wait between two wgmma groups makes ptxas serialise them.
    tma::mbar_wait(&full_q[s], uint32_t((n / kStages) & 1));
    tma::mbar_wait(&full_do[s], uint32_t((n / kStages) & 1));

    // S^T and dP^T for this consumer's 64 keys x the 64 queries.
    float st[kBr / 2], dpt[kBr / 2];
    {
      // Descriptors made inside the loop (tile_desc is opaque): hoisted, the per-step ones would
      // hold 32 registers.
      const uint64_t dK = wgmma::tile_desc(sK, 16), dV = wgmma::tile_desc(sV, 16);
      const uint64_t dQ = wgmma::tile_desc(cQ, 16), ddO = wgmma::tile_desc(cdO, 16);
      wgmma::fence();
      sm90::mma_rows<kD, kBc, kBr, kBr>(st, dK, dQ, 64 * cw, 0);
      wgmma::commit();
      sm90::mma_rows<kD, kBc, kBr, kBr>(dpt, dV, ddO, 64 * cw, 0);
      wgmma::commit();
      wgmma::wait_regs<1>(st);  // S^T; dP^T may still run
    }
    // P^T = exp(S^T - lse), 0 where not visible.
    if (masked) {
      const int j = k0 + jl;
#pragma unroll
      for (int nn = 0; nn < kBr / 8; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = q0 + 8 * nn + col0 + (e & 1);
          const float lse2 = cStat[8 * nn + col0 + (e & 1)];
          const int jj = j + 8 * (e >> 1);
          st[4 * nn + e] = jj <= i && i < seq && (window <= 0 || i - jj < window)
                               ? fast_exp2(fmaf(st[4 * nn + e], scale_log2, -lse2))
                               : 0.f;
        }
    } else {
#pragma unroll
      for (int nn = 0; nn < kBr / 8; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          st[4 * nn + e] = fast_exp2(fmaf(st[4 * nn + e], scale_log2, -cStat[8 * nn + col0 + (e & 1)]));
    }
    // dV += P^T dO (P^T from registers) right away: it needs only P^T, so it runs while dS^T is made.
    sm90::pack_p<kBr / 8>(pt, st);
    const uint64_t ddOn = wgmma::tile_desc(cdO, kBr * 128), dQn = wgmma::tile_desc(cQ, kBr * 128);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) Wgmma<kD>::template rs<1>(dva, pt[kk], wgmma::desc_mn_major<kBr>(ddOn, kk), 1);
    wgmma::commit();
    wgmma::wait_regs<1>(dpt);  // dP^T; dV may still run
    // dS^T = P^T (dP^T - D).
#pragma unroll
    for (int nn = 0; nn < kBr / 8; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e) dpt[4 * nn + e] = st[4 * nn + e] * (dpt[4 * nn + e] - cStat[kBr + 8 * nn + col0 + (e & 1)]);
    uint32_t dst[kBr / 16][4];
    sm90::pack_p<kBr / 8>(dst, dpt);
    sm90::store_a<kBc>(cdS, dst, jl, 0, col0);  // dS^T to shared memory for dQ
    wgmma::fence_proxy_async();
    tma::named_sync(kOwnBar + cw, 128);  // this consumer's dS^T rows are in shared memory
    if constexpr (!kSplitK) {
      // Head_dim 128: dQ reads both consumers' dS^T. Announce this one's, wait for the other's
      // (its dK and dV are already queued, so the tensor cores stay busy while the later consumer
      // catches up). Two barriers per direction, by item parity: a consumer reaches the same one
      // again only after the other has passed its wait on it (it waited for the other's next one).
      tma::named_arrive(kCrossBar + 2 * cw + (n & 1), 256);
      tma::named_sync(kCrossBar + 2 * (1 - cw) + (n & 1), 256);
    }

    // dQ (64 queries x kNq columns) = dS K, as in the sm90 kernel.
    // dQ first, then dK += dS^T Q (dS^T from registers, as P^T for dV), as FlashAttention-3 orders
    // them: dQ's tile goes to shared memory and to the writer while dK runs.
    float dqa[kNq / 2];
    sm90::issue_dq<kBc, kNq, kSplitK>(dqa, cdS, sK, cw);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) Wgmma<kD>::template rs<1>(dka, dst[kk], wgmma::desc_mn_major<kBr>(dQn, kk), 1);
    wgmma::commit();
    wgmma::wait_regs<1>(dva, dqa, pt);  // dV and dQ; dK may still run
    __syncwarp();
    if (lane == 0) tma::mbar_arrive(&empty_do[s]);  // dO (and its D) is read no more

    if constexpr (kSplitK) {
      // Head_dim 64: consumer 0 writes its partial dQ once the writer has read the previous item's
      // sum; consumer 1 adds its own into the same tile and hands the sum to the writer (one
      // reduction to L2 an item instead of two). Consumer 0 writes item n + 1's only after the
      // writer read item n's, which was after consumer 1's addition: one barrier id serves.
      if (cw == 0) {
        tma::mbar_wait(&dq_empty[0], uint32_t(n & 1) ^ 1u);
        sm90::store_dq_tile<kNq>(dqa, sdQ, warp, lane);
        tma::named_arrive(kMergeBar, 256);
      } else {
        tma::named_sync(kMergeBar, 256);
        sm90::store_dq_tile<kNq, true>(dqa, sdQ, warp, lane);
        wgmma::fence_proxy_async();
        tma::mbar_arrive(&dq_full[0]);
      }
    } else {
      // dQ into this consumer's tile once the writer has read the previous item's, then to the writer.
      tma::mbar_wait(&dq_empty[cw], uint32_t(n & 1) ^ 1u);
      sm90::store_dq_tile<kNq>(dqa, dq_tile, warp, lane);
      wgmma::fence_proxy_async();
      tma::mbar_arrive(&dq_full[cw]);
    }
    wgmma::wait_regs<0>(dka, dst);  // dK: this item's Q (and its lse) is read no more
    __syncwarp();
    if (lane == 0) tma::mbar_arrive(&empty_q[s]);
  }

  sm90::store_dkv<kD>(dka, dva, p, b, g, k0 + jl, 0, col0, dk, dv);
#else
  __trap();  // built without sm_90a; backward_sm90_ws is never called then (sm90_ready())
#endif
}

template <int kD>
void launch_ws_bwd(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                   const float* lse, const float* dsum, float* dq_acc, bf16* dk, bf16* dv, Stream s) {
  auto* kernel = flash_bwd_sm90_ws_kernel<kD>;
  constexpr size_t kSmem = ws_bwd_smem<kD>();
  allow_dynamic_smem<flash_bwd_sm90_ws_kernel<kD>>(kSmem);
  const CUtensorMap mq = tma::make_bshd_map(q, p.batch, p.seq, p.heads, p.head_dim, kBr);
  const CUtensorMap mdo = tma::make_bshd_map(dout, p.batch, p.seq, p.heads, p.head_dim, kBr);
  const CUtensorMap mk = tma::make_bshd_map(k, p.batch, p.seq, p.kv_heads, p.head_dim, kBc);
  const CUtensorMap mv = tma::make_bshd_map(v, p.batch, p.seq, p.kv_heads, p.head_dim, kBc);
  const CUtensorMap mdq = tma::make_bshd_map_f32(dq_acc, p.batch, p.seq, p.heads, p.head_dim, kBr);
  kernel<<<ws::launch_grid<kBc>(p), kThreads, kSmem, s>>>(mq, mk, mv, mdo, mdq, p, lse, dsum, dk, dv);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace

// As the forward's: rows at least one 64-column box wide (narrower ones run the sm90 kernel); head
// dims 129..256 run flash_attention_bwd_sm90_ws_d256.cu's kernel.
bool sm90_ws_bwd_supported(const AttentionParams& p) {
  return p.softcap <= 0.f && p.segment_ids == nullptr && p.head_dim >= 64 && p.head_dim <= 256 && p.head_dim % 8 == 0 &&
         p.seq < (int64_t(1) << 30) && p.window < (int64_t(1) << 30);
}

void backward_sm90_ws(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                      const float* lse, const float* dsum, float* dq_acc, bf16* dk, bf16* dv, Stream s) {
  LOOM_CHECK(sm90_ws_bwd_supported(p), "flash backward_sm90_ws: unsupported attention (soft-cap, segments "
                                       "or head_dim ", p.head_dim, ")");
  if (p.head_dim <= 64) launch_ws_bwd<64>(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv, s);
  else if (p.head_dim <= 128) launch_ws_bwd<128>(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv, s);
  else backward_sm90_ws_d256(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv, s);
}

}  // namespace loom::cuda::flash
