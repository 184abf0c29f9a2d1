// Flash attention backward on Hopper (sm_90a wgmma) for head_dim 129..256 (padded with zeros to
// 256), every feature (soft-cap, window, documents, grouped-query heads). At head_dim 256 the
// variant for <= 128 would hold dK and dV for 64 keys in 256 registers per thread, so the two
// warpgroups of a block split the head dimension instead of the keys (FlashAttention-3's hdim256
// backward does the same: 2 MMA warpgroups, 64 x 64-80 tiles, dK and dV split along head_dim).
//
// Block = 2 warpgroups (256 threads) per (64 keys, kv head, batch row); grid and key order as
// flash_attention_bwd_sm90.cu. Items = the query tiles of kBr = 64 rows that can see the keys, for
// every query head of the group (Q, dO, lse and D double-buffered through cp.async). Per item,
// warpgroup w:
//   S^T = K Q^T and dP^T = V dO^T for the 64 keys x queries 32 w .. 32 w + 31 (m64n32, A = K or V,
//     B = Q or dO rows, both K-major in shared memory, 16 k-steps over head_dim);
//   P^T and dS^T = P^T (dP^T - D) dcap in registers, both to shared memory as bf16 (its 32 query
//     columns of each 64 x 64 tile); block barrier;
//   dV += P^T dO and dK += dS^T Q for the 64 keys x head_dim columns 128 w .. 128 w + 127 (m64n128,
//     A = P^T or dS^T K-major, B = dO or Q read N-major): 2 x 64 f32 registers per thread;
//   dQ = dS K for the 64 queries x columns 128 w .. (A = dS^T read M-major, B = K read N-major),
//     added to the f32 accumulator with 16-byte atomics.
// Shared memory: K, V 2 x 32 KB; Q, dO 2 stages x 2 x 32 KB; P^T, dS^T 2 x 8 KB; lse, D 1 KB:
// 209 KB (+ 1 KB alignment slack) of the 227 KB a block may have. dQ through shared memory and
// tensor reductions (as the warp-specialised kernel does) would need 64 KB more for one 64 x 256
// f32 tile: it does not fit beside double-buffered Q and dO (flash_attention_bwd_sm90_ws_d256.cu
// does it with one Q/dO stage).
// dsum (D_i = dout_i . out_i) and the dq accumulator come from flash_attention.cu.
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/flash_mask.cuh"
#include "kernels/cuda/flash_sm90_pipeline.cuh"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace loom::cuda::flash {
namespace {

using wgmma::Wgmma;

constexpr int kBr = 64, kBc = 64, kD = 256, kThreads = 256;
constexpr int kQn = kBr / 2;  // queries of S^T and dP^T per warpgroup
constexpr int kDn = kD / 2;   // head_dim columns of dK, dV and dQ per warpgroup
static_assert(kQn % 16 == 0 && kDn % 64 == 0, "warpgroup slices hold whole k-steps and 64-column blocks");

constexpr size_t kTileBytes = size_t(kBc) * kD * sizeof(bf16);  // K or V; Q or dO (kBr == kBc)
static_assert(kBr == kBc, "Q, dO, K and V tiles share one size");
constexpr size_t kScoreBytes = size_t(kBc) * kBr * sizeof(bf16);  // P^T or dS^T
constexpr size_t kStatBytes = 2 * 2 * kBr * sizeof(float);        // lse and D, two stages
// K, V, two stages of Q and dO, P^T, dS^T, lse and D, slack to align the tiles to 1024 bytes.
constexpr size_t kSmem = 6 * kTileBytes + 2 * kScoreBytes + kStatBytes + 1024;
static_assert(kTileBytes % 1024 == 0 && kScoreBytes % 1024 == 0, "each swizzled tile starts on 1024 bytes");
static_assert(kSmem <= 227 * 1024, "over the 227 KB of shared memory a block may have on sm_90");

__global__ void __launch_bounds__(kThreads, 1)
    flash_bwd_sm90_d256_kernel(AttentionParams p, const bf16* __restrict__ q, const bf16* __restrict__ k,
                               const bf16* __restrict__ v, const bf16* __restrict__ dout, const float* __restrict__ lse,
                               const float* __restrict__ dsum, float* __restrict__ dq_acc, bf16* __restrict__ dk,
                               bf16* __restrict__ dv) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = sm90::BwdKeyTile<kBr, kBc, kD, kThreads>;
  extern __shared__ unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
  bf16* sPt = Tile::end(smem);   // P^T [kBc keys][kBr queries], swizzled
  bf16* sdSt = sPt + kBc * kBr;  // dS^T, likewise
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  Tile t(p, smem, reinterpret_cast<float*>(sdSt + kBc * kBr), tid, lane);
  const bf16* sK = t.sK;
  const int64_t k0 = t.k0, b = t.b;
  const Visibility vis{p.seq, p.window, t.seg};
  const float scale_log2 = p.scale * kLog2e;
  t.start(p, q, k, v, dout, lse, dsum, tid, lane);

  // This thread's key rows (jl, jl + 8 within the tile; the same in both warpgroups), its query
  // columns of S^T (qc0 + 8 n + col0 + e % 2) and its head_dim columns of dK, dV, dQ (dc0 + ...).
  const int jl = 16 * (warp & 3) + (lane >> 2), col0 = 2 * (lane & 3);
  const int qc0 = kQn * wg, dc0 = kDn * wg;
  float dka[kDn / 2], dva[kDn / 2], st[kQn / 2], dpt[kQn / 2], dqa[kDn / 2];
#pragma unroll
  for (int i = 0; i < kDn / 2; ++i) dka[i] = dva[i] = 0.f;
#pragma unroll
  for (int i = 0; i < kQn / 2; ++i) st[i] = dpt[i] = 0.f;
#pragma unroll
  for (int i = 0; i < kDn / 2; ++i) dqa[i] = 0.f;

  while (t.more()) {
    // This item's tiles have landed; every warp is done with the other stage, P^T and dS^T (its
    // wgmma of the previous item were waited for).
    TileKind next_kind = TileKind::kSkip;
    const int next = t.prefetch(p, q, dout, lse, dsum, lane, &next_kind);
    const bf16 *cQ = t.q_tile(), *cdO = t.do_tile();
    const float* cStat = t.stats();
    const int64_t h = t.head(), q0 = t.q_start();

    // S^T and dP^T: the 64 keys x this warpgroup's 32 queries, over all of head_dim.
    sm90::scores_t<kD, kBc, kBr, kQn>(st, dpt, sK, t.sV, cQ, cdO, 0, qc0);

    // P^T = exp(S^T - lse) (0 where not visible) and dS^T = P^T (dP^T - D) dcap, then both to
    // shared memory (this warpgroup's 32 columns of each).
    uint32_t bits[2] = {~0u, ~0u};
    if (t.kind == TileKind::kMasked)
      fragment_bits<kQn>(bits, col0, [&](int r, int col) { return vis(q0 + qc0 + col, k0 + jl + 8 * r); });
    sm90::bwd_scores<kQn>(st, dpt, bits, cStat + qc0, cStat + kBr + qc0, col0, p.scale, p.softcap, scale_log2);
    {
      uint32_t pt[kQn / 16][4], dst[kQn / 16][4];
      sm90::pack_p<kQn / 8>(pt, st);
      sm90::pack_p<kQn / 8>(dst, dpt);
      sm90::store_a<kBc>(sPt, pt, jl, qc0, col0);
      sm90::store_a<kBc>(sdSt, dst, jl, qc0, col0);
    }
    wgmma::fence_proxy_async();
    __syncthreads();  // both warpgroups' halves of P^T and dS^T are in shared memory

    // dQ = dS K (64 queries x columns dc0..) first, a commit group of its own: its atomics then run
    // while dV += P^T dO and dK += dS^T Q (64 keys x columns dc0..) are multiplied.
    sm90::issue_dq<kBc, kDn, false>(dqa, sdSt, sK, wg);
    sm90::issue_dv_dk<kBr, kBc, kDn>(dva, dka, sPt, sdSt, cdO, cQ, dc0);
    wgmma::wait_regs<1>(dqa);
    sm90::add_dq_atomic<kDn>(dqa, dq_acc, p, b, h, q0, dc0, warp, lane);
    wgmma::wait_regs<0>(dva, dka);  // P^T, dS^T, Q and dO are read no more
    t.advance(next, next_kind);
  }
  flash::cp_async_wait<0>();
  sm90::store_dkv<kDn>(dka, dva, p, b, t.g, k0 + jl, dc0, col0, dk, dv);
#else
  __trap();  // built without sm_90a; backward_sm90_d256 is never called then (sm90_ready())
#endif
}

}  // namespace

void backward_sm90_d256(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                        const float* lse, const float* dsum, float* dq_acc, bf16* dk, bf16* dv, Stream s) {
  LOOM_CHECK(p.head_dim > 128 && p.head_dim <= kD && p.head_dim % 8 == 0,
             "flash backward_sm90_d256: head_dim ", p.head_dim, " is not a multiple of 8 in 129..256");
  auto* kernel = flash_bwd_sm90_d256_kernel;
  allow_dynamic_smem<flash_bwd_sm90_d256_kernel>(kSmem);
  const dim3 grid(unsigned(p.kv_heads), unsigned(p.batch), unsigned((p.seq + kBc - 1) / kBc));
  kernel<<<grid, kThreads, kSmem, s>>>(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace loom::cuda::flash
