// Flash attention backward on Hopper (sm_90a wgmma), head_dim <= 128: one block of two warpgroups
// per (128 keys, kv head, batch row), warpgroup w owning keys 64 w .. 64 w + 63. For every query
// tile of 64 rows of every head in the group (Q, dO, lse and D double-buffered through cp.async):
//   S^T = K Q^T and dP^T = V dO^T (A = K or V rows, B = Q or dO, both K-major in shared memory);
//   P^T and dS^T = P^T (dP^T - D) in registers, dS^T also to shared memory;
//   dV += P^T dO and dK += dS^T Q (A from registers, B = dO or Q read N-major): f32 in registers;
//   dQ += dS K (A = dS^T read M-major, B = K read N-major), added to the f32 accumulator with
//   16-byte atomics: at head_dim 128 each warpgroup takes 64 of the columns over all 128 keys; at 64
//   each takes all columns over its own 64 keys.
// (dQ through shared memory and bulk reductions, and the exponentials overlapping dP^T's product,
// the former variants 4 and 5, were slower or no faster: 1667 and 1551 us against 1448 at head_dim
// 128, b4 s2048 h32/8, H200, 2026-12-02, though not all in one run.)
// dsum (D_i = dout_i . out_i) and the dq accumulator come from flash_attention_bwd.cu.
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/flash_mask.cuh"
#include "kernels/cuda/flash_sm90_pipeline.cuh"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace loom::cuda::flash {
namespace {

using wgmma::Wgmma;

constexpr int kBr = 64, kBc = 128, kThreads = 256;

template <int kD>
constexpr size_t sm90_bwd_smem() {
  // K, V; Q and dO in two stages; dS^T; lse and D for two stages; slack for 1024-byte alignment.
  return size_t(2 * kBc + 4 * kBr) * kD * sizeof(bf16) + size_t(kBc) * kBr * sizeof(bf16) + 2 * 2 * kBr * sizeof(float) +
         1024;
}

template <int kD>
__global__ void __launch_bounds__(kThreads, 1)
    flash_bwd_sm90_kernel(AttentionParams p, const bf16* __restrict__ q, const bf16* __restrict__ k,
                          const bf16* __restrict__ v, const bf16* __restrict__ dout, const float* __restrict__ lse,
                          const float* __restrict__ dsum, float* __restrict__ dq_acc, bf16* __restrict__ dk,
                          bf16* __restrict__ dv) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kSplitK = kD == 64;          // dQ: each warpgroup its own keys, all columns
  constexpr int kNq = kSplitK ? kD : kD / 2;  // dQ columns per warpgroup
  static_assert(kNq == 64, "dQ column blocks start on a 64-column boundary");
  using Tile = sm90::BwdKeyTile<kBr, kBc, kD, kThreads>;
  extern __shared__ unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
  bf16* sdS = Tile::end(smem);  // dS^T [kBc keys][kBr queries], swizzled
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, wg = wgmma::warpgroup();
  Tile t(p, smem, reinterpret_cast<float*>(sdS + kBc * kBr), tid, lane);
  const bf16* sK = t.sK;
  const int64_t k0 = t.k0, b = t.b;
  const Visibility vis{p.seq, p.window, t.seg};
  const float scale_log2 = p.scale * kLog2e;
  t.start(p, q, k, v, dout, lse, dsum, tid, lane);

  // This thread's key rows (j0, j0 + 8 within the tile) and query columns (8 n + col0 + e % 2).
  const int jl = 64 * wg + 16 * (warp & 3) + (lane >> 2), col0 = 2 * (lane & 3);
  float dka[kD / 2], dva[kD / 2], st[kBr / 2], dpt[kBr / 2], dqa[kNq / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dka[i] = dva[i] = 0.f;
#pragma unroll
  for (int i = 0; i < kBr / 2; ++i) st[i] = dpt[i] = 0.f;
#pragma unroll
  for (int i = 0; i < kNq / 2; ++i) dqa[i] = 0.f;
  uint32_t pt[kBr / 16][4], dst[kBr / 16][4];

  while (t.more()) {
    // This item's tiles have landed; every warp is done with the other stage and with sdS.
    TileKind next_kind = TileKind::kSkip;
    const int next = t.prefetch(p, q, dout, lse, dsum, lane, &next_kind);
    const bf16 *cQ = t.q_tile(), *cdO = t.do_tile();
    const float* cStat = t.stats();
    const int64_t h = t.head(), q0 = t.q_start();

    // S^T and dP^T for this warpgroup's 64 keys x the 64 queries.
    sm90::scores_t<kD, kBc, kBr, kBr>(st, dpt, sK, t.sV, cQ, cdO, 64 * wg, 0);

    // P^T = exp(S^T - lse) (0 where not visible) and dS^T = P^T (dP^T - D) dcap, per element.
    uint32_t bits[2] = {~0u, ~0u};
    if (t.kind == TileKind::kMasked)
      fragment_bits<kBr>(bits, col0, [&](int r, int col) { return vis(q0 + col, k0 + jl + 8 * r); });
    sm90::bwd_scores<kBr>(st, dpt, bits, cStat, cStat + kBr, col0, p.scale, p.softcap, scale_log2);
    sm90::pack_p<kBr / 8>(pt, st);
    sm90::pack_p<kBr / 8>(dst, dpt);
    sm90::store_a<kBc>(sdS, dst, jl, 0, col0);  // dS^T to shared memory for dQ
    wgmma::fence_proxy_async();

    // dV += P^T dO, dK += dS^T Q: issued before the dS^T exchange.
    {
      const uint64_t ddO = wgmma::tile_desc(cdO, kBr * 128), dQ = wgmma::tile_desc(cQ, kBr * 128);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kBr / 16; ++kk) Wgmma<kD>::template rs<1>(dva, pt[kk], wgmma::desc_mn_major<kBr>(ddO, kk), 1);
#pragma unroll
      for (int kk = 0; kk < kBr / 16; ++kk) Wgmma<kD>::template rs<1>(dka, dst[kk], wgmma::desc_mn_major<kBr>(dQ, kk), 1);
      wgmma::commit();
    }
    __syncthreads();  // every warpgroup's dS^T is in shared memory

    // dQ (64 queries x kNq columns from n0) = dS K: at head_dim 128 this warpgroup's 64 columns over
    // all keys, at 64 all columns over its own keys.
    {
      const int n0 = sm90::issue_dq<kBc, kNq, kSplitK>(dqa, sdS, sK, wg);
      wgmma::wait_regs<0>(dqa, dva, dka);  // dV, dK and dQ
      sm90::add_dq_atomic<kNq>(dqa, dq_acc, p, b, h, q0, n0, warp, lane);
    }
    t.advance(next, next_kind);
  }
  flash::cp_async_wait<0>();
  wgmma::wait_regs<0>(dva, dka);
  sm90::store_dkv<kD>(dka, dva, p, b, t.g, k0 + jl, 0, col0, dk, dv);
#else
  __trap();  // built without sm_90a; backward_sm90 is never called then (sm90_ready())
#endif
}

template <int kD>
void launch(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse,
            const float* dsum, float* dq_acc, bf16* dk, bf16* dv, Stream s) {
  auto* kernel = flash_bwd_sm90_kernel<kD>;
  constexpr size_t kSmem = sm90_bwd_smem<kD>();
  allow_dynamic_smem<flash_bwd_sm90_kernel<kD>>(kSmem);
  const dim3 grid(unsigned(p.kv_heads), unsigned(p.batch), unsigned((p.seq + kBc - 1) / kBc));
  kernel<<<grid, kThreads, kSmem, s>>>(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace

void backward_sm90(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                   const float* lse, const float* dsum, float* dq_acc, bf16* dk, bf16* dv, Stream s) {
  LOOM_CHECK(p.head_dim <= 128, "flash backward_sm90: head_dim ", p.head_dim, " > 128");
  if (p.head_dim <= 64) launch<64>(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv, s);
  else launch<128>(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv, s);
}

}  // namespace loom::cuda::flash
