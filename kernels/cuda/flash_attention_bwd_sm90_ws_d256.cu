// Flash attention backward on Hopper, warp-specialised, for head_dim 129..256 (Kernel::kSm90Ws at
// those widths; causal, windowed or not, no soft-cap or segments): the d128 warp-specialised
// kernel's scheme (flash_attention_bwd_sm90_ws.cu) with the d256 kernel's split of the work
// (flash_attention_bwd_sm90_d256.cu), so that dQ leaves through shared memory and TMA reductions
// instead of 16-byte atomics: the every-thread-loads d256 kernel is L2-bound (ncu, session 37: L2
// 76 % busy, tensor pipe 24 %) with 64 KB of dQ atomics an item.
//
// Block = 3 warpgroups (384 threads) per (kv head, batch row) and one or two key tiles of 64 keys,
// as the d128 kernel's (ws::block_tiles: causal without a window, tiles t and n - 1 - t). Items
// (ws::Items) = the query tiles of kBr = 64 rows that can see a tile's keys, the last first, each for
// the group's query heads in turn; then the second tile's.
//   warpgroup 0 (24 registers): warp 0 produces: K and V of the block once, then per item Q and dO
//     (TMA, 128-byte swizzle, 4 boxes of 64 columns each) into the one stage, with lse (times log2 e;
//     +inf past seq) and D written by its lanes; warp 1, lane 0, writes dQ: per item and consumer,
//     four tensor reductions (boxes of 64 rows x 32 f32 columns) of the consumer's dQ tile.
//   warpgroups 1 and 2 (240 registers), consumer c: S^T = K Q^T and dP^T = V dO^T for the 64 keys x
//     queries 32 c .. 32 c + 31 (m64n32 over head_dim), P^T and dS^T in registers and to shared
//     memory (its 32 columns of each, buffer n % 2); after the other consumer's half is there (named
//     barriers by item parity, as the d128 kernel's), dV += P^T dO and dK += dS^T Q for the 64 keys x
//     head_dim columns 128 c .. 128 c + 127, then dQ = dS K for the 64 queries x the same columns;
//     the stage is released once dV and dK are done, dQ goes to the consumer's tile for the writer.
// Shared memory: K, V 64 KB; Q, dO one stage 64 KB; P^T, dS^T 2 x 2 x 8 KB; dQ tiles 2 x 32 KB; lse,
// D 0.5 KB: 224.5 KB (+ 1 KB alignment slack) of the 227 a block may have, so Q and dO have one stage:
// the next item's load overlaps this one's dQ product, its write-out and the next scores' wait.
// Barriers: bar_kv (count 1); full_do and full_q (count 32: the producer's lanes, lane 0 with
// expect_tx); empty_do and empty_q (count 8: each consumer warp, dO once its dV product is done, Q
// once its dK product is; waited for both before S^T); dq_full[c] (count 128); dq_empty[c] (count 1),
// as in the d128 kernel, with one stage (item n: parity n & 1); kv_empty (count 8) as the d128
// kernel's: K and V's shared memory back to the producer between a block's two key tiles.
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

constexpr int kBr = 64, kBc = 64, kD = 256, kThreads = 384;
constexpr int kQn = kBr / 2;  // queries of S^T and dP^T per consumer
constexpr int kDn = kD / 2;   // head_dim columns of dK, dV and dQ per consumer
constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 128 x 24 + 256 x 240 <= 64 K registers
constexpr int kCrossBar = 1;                            // kCrossBar + 2 c + (n & 1): consumer c's half of item n

constexpr size_t kTileBytes = size_t(kBc) * kD * sizeof(bf16);     // K, V, Q or dO: 32 KB
constexpr size_t kScoreBytes = size_t(kBc) * kBr * sizeof(bf16);   // P^T or dS^T: 8 KB
constexpr size_t kDqBytes = size_t(kBr) * kDn * sizeof(float);     // a consumer's dQ tile: 32 KB
constexpr size_t kSmem = 4 * kTileBytes + 4 * kScoreBytes + 2 * kDqBytes + 2 * kBr * sizeof(float) + 1024;
static_assert(kSmem <= 227 * 1024, "over the 227 KB of shared memory a block may have on sm_90");
static_assert(kTileBytes % 1024 == 0 && kScoreBytes % 1024 == 0 && kDqBytes % 1024 == 0,
              "each swizzled tile starts on 1024 bytes");

__global__ void __launch_bounds__(kThreads, 1)
    flash_bwd_sm90_ws_d256_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                                  const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_do,
                                  const __grid_constant__ CUtensorMap map_dq, AttentionParams p,
                                  const float* __restrict__ lse, const float* __restrict__ dsum, bf16* __restrict__ dk,
                                  bf16* __restrict__ dv) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[ws::Barriers<1>::kCount];
  const ws::Barriers<1> bar(bars);  // one Q/dO stage
  uint64_t *full_q = bar.full_q, *empty_q = bar.empty_q, *full_do = bar.full_do, *empty_do = bar.empty_do,
           *dq_full = bar.dq_full, *dq_empty = bar.dq_empty;
  bf16* sK = reinterpret_cast<bf16*>(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
  bf16* sV = sK + kBc * kD;
  bf16* sQ = sV + kBc * kD;
  bf16* sdO = sQ + kBr * kD;
  bf16* sPt0 = sdO + kBr * kD;      // P^T [kBc keys][kBr queries], swizzled; buffer n % 2
  bf16* sdSt0 = sPt0 + 2 * kBc * kBr;  // dS^T, likewise
  float* sdQ = reinterpret_cast<float*>(sdSt0 + 2 * kBc * kBr);  // consumer c's at sdQ + c * kBr * kDn
  float* sStat = sdQ + 2 * kBr * kDn;                             // lse * log2 e [kBr], then D [kBr]

  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const int seq = int(p.seq), hd = int(p.head_dim);
  const int window = int(p.window);
  const auto [g, b, kt0, kt1] = ws::block_tiles<kBc>(p);
  const ws::Items<kBr, kBc> items(p, kt0, kt1, g);
  const int n_items = items.count;

  if (tid == 0) bar.init();
  __syncthreads();  // the last block-wide barrier

  if (wg == 0) {
    tma::regs_dec<kProducerRegs>();
    if (warp == 0) {  // ---- producer ----
      ws::produce<kBr, kBc, kD, 1>(&map_q, &map_k, &map_v, &map_do, p, lse, dsum, sK, sV, sQ, sdO, sStat, bar, items, b, lane);
    } else if (warp == 1 && lane == 0) {  // ---- dQ writer ----
      ws::write_dq<kBr, kBc, kDn, false>(&map_dq, sdQ, dq_full, dq_empty, items, hd, b);
    }
    return;
  }

  // ---- consumers ----
  tma::regs_inc<kConsumerRegs>();
  const int cw = wg - 1;
  const int jl = 16 * (warp & 3) + (lane >> 2), col0 = 2 * (lane & 3);  // key rows jl, jl + 8 of the block
  const int qc0 = kQn * cw, dc0 = kDn * cw;  // this consumer's queries of S^T and columns of dK, dV, dQ
  const float scale_log2 = p.scale * kLog2e;
  float dka[kDn / 2], dva[kDn / 2];
#pragma unroll
  for (int i = 0; i < kDn / 2; ++i) dka[i] = dva[i] = 0.f;
  float* dq_tile = sdQ + cw * kBr * kDn;

  tma::mbar_wait(bar.kv, 0);
  int k0 = kt0 * kBc;
#pragma unroll 1
  for (int n = 0; n < n_items; ++n) {
    if (n == items.split) {  // the block's second key tile: its first's dK and dV out, K and V anew
      ws::next_key_tile<kDn>(dka, dva, p, b, g, k0 + jl, dc0, col0, dk, dv, bar, lane);
      k0 = kt1 * kBc;
    }
    const int q0 = items.start(n);
    bf16* cPt = sPt0 + (n & 1) * kBc * kBr;
    bf16* cdSt = sdSt0 + (n & 1) * kBc * kBr;
    const bool masked = q0 < k0 + kBc - 1 || q0 + kBr > seq || (window > 0 && q0 + kBr - 1 - k0 >= window);
    tma::mbar_wait(full_q, uint32_t(n & 1));
    tma::mbar_wait(full_do, uint32_t(n & 1));

    // S^T and dP^T: the 64 keys x this consumer's 32 queries, over all of head_dim.
    float st[kQn / 2], dpt[kQn / 2];
    sm90::scores_t<kD, kBc, kBr, kQn>(st, dpt, sK, sV, sQ, sdO, 0, qc0);
    // P^T = exp(S^T - lse), 0 where not visible; dS^T = P^T (dP^T - D).
    const int j = k0 + jl;
#pragma unroll
    for (int nn = 0; nn < kQn / 8; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = qc0 + 8 * nn + col0 + (e & 1), i = q0 + c, jj = j + 8 * (e >> 1);
        const bool visible = !masked || (jj <= i && i < seq && (window <= 0 || i - jj < window));
        const float pv = visible ? fast_exp2(fmaf(st[4 * nn + e], scale_log2, -sStat[c])) : 0.f;
        st[4 * nn + e] = pv;
        dpt[4 * nn + e] = pv * (dpt[4 * nn + e] - sStat[kBr + c]);
      }
    {
      uint32_t pt[kQn / 16][4], dst[kQn / 16][4];
      sm90::pack_p<kQn / 8>(pt, st);
      sm90::pack_p<kQn / 8>(dst, dpt);
      sm90::store_a<kBc>(cPt, pt, jl, qc0, col0);
      sm90::store_a<kBc>(cdSt, dst, jl, qc0, col0);
    }
    wgmma::fence_proxy_async();
    // This half is written; wait for the other consumer's (the d128 kernel's two barriers a direction).
    tma::named_arrive(kCrossBar + 2 * cw + (n & 1), 256);
    tma::named_sync(kCrossBar + 2 * (1 - cw) + (n & 1), 256);

    // dV += P^T dO and dK += dS^T Q (64 keys x columns dc0 ..), then dQ = dS K (64 queries x the same).
    float dqa[kDn / 2];
    sm90::issue_dv_dk<kBr, kBc, kDn, true>(dva, dka, cPt, cdSt, sdO, sQ, dc0);
    sm90::issue_dq<kBc, kDn, false>(dqa, cdSt, sK, cw);
    // dO back once dV is done, Q once dK is (dQ reads dS^T and K): the producer loads the next dO
    // while dK runs.
    wgmma::wait_regs<2>(dva);
    __syncwarp();
    if (lane == 0) tma::mbar_arrive(empty_do);
    wgmma::wait_regs<1>(dka);
    __syncwarp();
    if (lane == 0) tma::mbar_arrive(empty_q);
    wgmma::wait_regs<0>(dqa);

    // dQ into this consumer's tile once the writer has read the previous item's, then to the writer.
    tma::mbar_wait(&dq_empty[cw], uint32_t(n & 1) ^ 1u);
    sm90::store_dq_tile<kDn>(dqa, dq_tile, warp, lane);
    wgmma::fence_proxy_async();
    tma::mbar_arrive(&dq_full[cw]);
  }

  sm90::store_dkv<kDn>(dka, dva, p, b, g, k0 + jl, dc0, col0, dk, dv);
#else
  __trap();  // built without sm_90a; backward_sm90_ws is never called then (sm90_ready())
#endif
}

}  // namespace

void backward_sm90_ws_d256(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                           const float* lse, const float* dsum, float* dq_acc, bf16* dk, bf16* dv, Stream s) {
  LOOM_CHECK(p.head_dim > 128 && p.head_dim <= kD && p.head_dim % 8 == 0 && sm90_ws_bwd_supported(p),
             "flash backward_sm90_ws_d256: head_dim ", p.head_dim, " is not a multiple of 8 in 129..256, or soft-cap "
             "or segments");
  auto* kernel = flash_bwd_sm90_ws_d256_kernel;
  allow_dynamic_smem<flash_bwd_sm90_ws_d256_kernel>(kSmem);
  const CUtensorMap mq = tma::make_bshd_map(q, p.batch, p.seq, p.heads, p.head_dim, kBr);
  const CUtensorMap mdo = tma::make_bshd_map(dout, p.batch, p.seq, p.heads, p.head_dim, kBr);
  const CUtensorMap mk = tma::make_bshd_map(k, p.batch, p.seq, p.kv_heads, p.head_dim, kBc);
  const CUtensorMap mv = tma::make_bshd_map(v, p.batch, p.seq, p.kv_heads, p.head_dim, kBc);
  const CUtensorMap mdq = tma::make_bshd_map_f32(dq_acc, p.batch, p.seq, p.heads, p.head_dim, kBr);
  kernel<<<ws::launch_grid<kBc>(p), kThreads, kSmem, s>>>(mq, mk, mv, mdo, mdq, p, lse, dsum, dk, dv);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace loom::cuda::flash
