// Flash attention backward (bf16, mma.sync m16n8k16), FlashAttention-2 style: one block per (key
// tile of kBc keys, kv head, batch row) accumulates dK and dV in registers over every query
// tile of every head in its group (Q and dO double-buffered through cp.async); P^T and dS^T go
// through shared memory; dQ is added in f32 with atomics into backward()'s accumulator.
// Warp w owns key rows 16 (w % (kBc / 16)) and a slice of the queries (scores) or of head_dim
// (dK, dV); for dQ, query rows 16 (w % 4) and a slice of head_dim.
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/flash_mask.cuh"

namespace loom::cuda::flash {
namespace {

constexpr int kBr = 64;  // queries per step

template <int kD, int kBc, int kWarps>
struct BwdConfig {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr size_t kSmem = (size_t(2 * kBc + 4 * kBr) * kD + 2 * size_t(kBc) * kBr) * sizeof(bf16);
};

template <int kD, int kBc, int kWarps, int kMT>
__global__ void __launch_bounds__(32 * kWarps, 1)
    flash_bwd_kernel(AttentionParams p, const bf16* __restrict__ q, const bf16* __restrict__ k,
                     const bf16* __restrict__ v, const bf16* __restrict__ dout, const float* __restrict__ lse,
                     const float* __restrict__ dsum, float* __restrict__ dq_acc, bf16* __restrict__ dk,
                     bf16* __restrict__ dv) {
  constexpr int kThreads = 32 * kWarps;
  constexpr int kKeyGroups = kBc / (16 * kMT), kSlices = kWarps / kKeyGroups;  // phases 1, 2: 16 kMT keys
  static_assert(kWarps % kKeyGroups == 0 && kWarps % 4 == 0, "warps must tile the key rows and the query rows");
  constexpr int kQn = kBr / kSlices, kNt1 = kQn / 8;   // phase 1: queries per warp, their 8-wide tiles
  constexpr int kDn = kD / kSlices, kNt2 = kDn / 8;    // phase 2: head_dim columns per warp
  constexpr int kDn3 = kD / (kWarps / 4), kNt3 = kDn3 / 8;  // phase 3: 16 queries x kDn3 columns per warp
  static_assert(kQn % 16 == 0 && kDn % 16 == 0 && kDn3 % 16 == 0, "warp slices must hold whole MMA tiles");
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + kBc * kD;
  bf16* sQ = sV + kBc * kD;     // [2][kBr * kD]
  bf16* sdO = sQ + 2 * kBr * kD;  // [2][kBr * kD]
  bf16* sP = sdO + 2 * kBr * kD;  // P^T [kBc][kBr]
  bf16* sdS = sP + kBc * kBr;     // dS^T [kBc][kBr]

  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int wr = warp % kKeyGroups, wc = warp / kKeyGroups;  // key group, query or head_dim slice
  const int wq = warp % 4, wd = warp / 4;                     // phase 3: query group, head_dim slice
  const int64_t k0 = int64_t(blockIdx.x) * kBc, g = blockIdx.y, b = blockIdx.z;
  const int hd = int(p.head_dim);
  const int64_t q_stride = p.heads * p.head_dim, kv_stride = p.kv_heads * p.head_dim;
  const int32_t* seg = p.segment_ids ? p.segment_ids + b * p.seq : nullptr;
  const Visibility vis{p.seq, p.window, seg};
  const float scale_log2 = p.scale * kLog2e;
  const FragLane f16 = frag_rows16(lane), f8x2 = frag_rows8x2(lane);

  const KeyTileItems<kBr, kBc> items(p, seg, k0, lane);
  const int n_items = items.n_items;
  auto load_q_tiles = [&](int item, int buf) {
    const int64_t h = items.head(g, item), q0 = items.q_start(item);
    const int64_t off = (b * p.seq * p.heads + h) * p.head_dim;
    load_tile<kBr, kD, kThreads>(sQ + buf * kBr * kD, q + off, q_stride, q0, p.seq, hd);
    load_tile<kBr, kD, kThreads>(sdO + buf * kBr * kD, dout + off, q_stride, q0, p.seq, hd);
  };

  const int64_t kv_off = (b * p.seq * p.kv_heads + g) * p.head_dim;
  load_tile<kBc, kD, kThreads>(sK, k + kv_off, kv_stride, k0, p.seq, hd);
  load_tile<kBc, kD, kThreads>(sV, v + kv_off, kv_stride, k0, p.seq, hd);
  TileKind kind = TileKind::kSkip;
  int item = items.first(p, seg, k0, lane, &kind);
  if (item < n_items) load_q_tiles(item, 0);
  cp_async_commit();

  const int krow = 16 * kMT * wr;  // this warp's first key row in phases 1 and 2
  float dka[kMT][kNt2][4], dva[kMT][kNt2][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int n = 0; n < kNt2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dka[mt][n][e] = dva[mt][n][e] = 0.f;

  int buf = 0;
  while (item < n_items) {
    TileKind next_kind = TileKind::kSkip;
    const int next = items.next(p, seg, item + 1, k0, lane, &next_kind);
    if (next < n_items) load_q_tiles(next, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this item's Q and dO (and K, V) have landed
    __syncthreads();
    const bf16* cQ = sQ + buf * kBr * kD;
    const bf16* cdO = sdO + buf * kBr * kD;
    const int64_t h = items.head(g, item), q0 = items.q_start(item);
    const float* lse_h = lse + (b * p.heads + h) * p.seq;
    const float* dsum_h = dsum + (b * p.heads + h) * p.seq;

    // Phase 1: S^T = K Q^T and dP^T = V dO^T for keys krow.. (16 kMT) x queries kQn wc..; then P^T
    // and dS^T = P^T * (dP^T - D) * dcap into shared memory. Each Q / dO fragment serves kMT tiles.
    {
      float st[kMT][kNt1][4], dpt[kMT][kNt1][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int n = 0; n < kNt1; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) st[mt][n][e] = dpt[mt][n][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t ak[kMT][4], av[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          load_a<kD>(ak[mt], sK, krow + 16 * mt, kk * 16, f16);
          load_a<kD>(av[mt], sV, krow + 16 * mt, kk * 16, f16);
        }
#pragma unroll
        for (int n = 0; n < kNt1; n += 2) {
          uint32_t bq[4], bo[4];
          load_b_nk<kD>(bq, cQ, wc * kQn + n * 8, kk * 16, f8x2);
          load_b_nk<kD>(bo, cdO, wc * kQn + n * 8, kk * 16, f8x2);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma16816(st[mt][n], ak[mt], bq[0], bq[1]);
            mma16816(st[mt][n + 1], ak[mt], bq[2], bq[3]);
            mma16816(dpt[mt][n], av[mt], bo[0], bo[1]);
            mma16816(dpt[mt][n + 1], av[mt], bo[2], bo[3]);
          }
        }
      }
#pragma unroll
      for (int n = 0; n < kNt1; ++n) {
        const int ic = wc * kQn + n * 8 + 2 * (lane & 3);  // query column of elements 0 and 2
        float lse2[2], dsv[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int64_t i = q0 + ic + c;
          lse2[c] = i < p.seq ? lse_h[i] * kLog2e : INFINITY;  // rows past the end get P = 0
          dsv[c] = i < p.seq ? dsum_h[i] : 0.f;
        }
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          const int jr0 = krow + 16 * mt + (lane >> 2);
          float dcap[4] = {1.f, 1.f, 1.f, 1.f};
          if (p.softcap > 0.f) {
#pragma unroll
            for (int e = 0; e < 4; ++e) st[mt][n][e] = cap_dot(st[mt][n][e], p.scale, p.softcap, &dcap[e]);
          }
          float pv[4], dsv_out[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) pv[e] = fast_exp2(fmaf(st[mt][n][e], scale_log2, -lse2[e & 1]));
          if (kind == TileKind::kMasked) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (!vis(q0 + ic + (e & 1), k0 + jr0 + (e >= 2 ? 8 : 0))) pv[e] = 0.f;
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) dsv_out[e] = pv[e] * (dpt[mt][n][e] - dsv[e & 1]) * dcap[e];
          *reinterpret_cast<uint32_t*>(sP + swz<kBr>(jr0, ic)) = pack_bf16(pv[0], pv[1]);
          *reinterpret_cast<uint32_t*>(sP + swz<kBr>(jr0 + 8, ic)) = pack_bf16(pv[2], pv[3]);
          *reinterpret_cast<uint32_t*>(sdS + swz<kBr>(jr0, ic)) = pack_bf16(dsv_out[0], dsv_out[1]);
          *reinterpret_cast<uint32_t*>(sdS + swz<kBr>(jr0 + 8, ic)) = pack_bf16(dsv_out[2], dsv_out[3]);
        }
      }
    }
    __syncthreads();

    // Phase 2: dV += P^T dO and dK += dS^T Q for keys krow.. x head_dim columns kDn wc...
#pragma unroll
    for (int kq = 0; kq < kBr / 16; ++kq) {
      uint32_t ap[kMT][4], ads[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        load_a<kBr>(ap[mt], sP, krow + 16 * mt, kq * 16, f16);
        load_a<kBr>(ads[mt], sdS, krow + 16 * mt, kq * 16, f16);
      }
#pragma unroll
      for (int n = 0; n < kNt2; n += 2) {
        uint32_t bo[4], bq[4];
        load_b_kn<kD>(bo, cdO, kq * 16, wc * kDn + n * 8, f16);
        load_b_kn<kD>(bq, cQ, kq * 16, wc * kDn + n * 8, f16);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma16816(dva[mt][n], ap[mt], bo[0], bo[1]);
          mma16816(dva[mt][n + 1], ap[mt], bo[2], bo[3]);
          mma16816(dka[mt][n], ads[mt], bq[0], bq[1]);
          mma16816(dka[mt][n + 1], ads[mt], bq[2], bq[3]);
        }
      }
    }

    // Phase 3: dQ += dS K for queries 16 wq.. x head_dim columns kDn3 wd.., added to dq_acc.
    {
      float dqa[kNt3][4];
#pragma unroll
      for (int n = 0; n < kNt3; ++n) dqa[n][0] = dqa[n][1] = dqa[n][2] = dqa[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        uint32_t a[4];
        load_a_t<kBr>(a, sdS, kk * 16, 16 * wq, f8x2);
#pragma unroll
        for (int n = 0; n < kNt3; n += 2) {
          uint32_t bk[4];
          load_b_kn<kD>(bk, sK, kk * 16, wd * kDn3 + n * 8, f16);
          mma16816(dqa[n], a, bk[0], bk[1]);
          mma16816(dqa[n + 1], a, bk[2], bk[3]);
        }
      }
      const int64_t i0 = q0 + 16 * wq + (lane >> 2);
      float* base = dq_acc + (b * p.seq * p.heads + h) * p.head_dim;
#pragma unroll
      for (int n = 0; n < kNt3; ++n) {
        const int col = wd * kDn3 + n * 8 + 2 * (lane & 3);
        if (col >= hd) break;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t i = i0 + 8 * r;
          if (i >= p.seq) continue;
          float* dst = base + i * q_stride + col;
#if __CUDA_ARCH__ >= 900
          atomicAdd(reinterpret_cast<float2*>(dst), make_float2(dqa[n][2 * r], dqa[n][2 * r + 1]));
#else
          atomicAdd(dst, dqa[n][2 * r]);
          atomicAdd(dst + 1, dqa[n][2 * r + 1]);
#endif
        }
      }
    }
    __syncthreads();  // sP, sdS and this buffer are free again
    buf ^= 1;
    item = next;
    kind = next_kind;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    const int64_t j0 = k0 + krow + 16 * mt + (lane >> 2);
#pragma unroll
    for (int n = 0; n < kNt2; ++n) {
      const int col = wc * kDn + n * 8 + 2 * (lane & 3);
      if (col >= hd) break;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t j = j0 + 8 * r;
        if (j >= p.seq) continue;
        const int64_t off = (b * p.seq + j) * kv_stride + g * p.head_dim + col;
        *reinterpret_cast<__nv_bfloat162*>(dk + off) =
            __floats2bfloat162_rn(dka[mt][n][2 * r] * p.scale, dka[mt][n][2 * r + 1] * p.scale);
        *reinterpret_cast<__nv_bfloat162*>(dv + off) =
            __floats2bfloat162_rn(dva[mt][n][2 * r], dva[mt][n][2 * r + 1]);
      }
    }
  }
}

template <int kD, int kBc, int kWarps, int kMT = 1>
void launch_bwd(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                const float* lse, const float* dsum, float* dq_acc, bf16* dk, bf16* dv, Stream s) {
  using C = BwdConfig<kD, kBc, kWarps>;
  auto* kernel = flash_bwd_kernel<kD, kBc, kWarps, kMT>;
  allow_dynamic_smem<flash_bwd_kernel<kD, kBc, kWarps, kMT>>(C::kSmem);
  const dim3 grid(unsigned((p.seq + kBc - 1) / kBc), unsigned(p.kv_heads), unsigned(p.batch));
  kernel<<<grid, C::kThreads, C::kSmem, s>>>(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace

// 128 keys per block, 8 warps of 32 keys x half the queries / head_dim, so that each Q and dO
// fragment serves two key tiles (2567 us at head_dim 128, b4 s2048 h32/8, H200, 2026-12-02; it was
// the default over the 16-key-warp shapes with 64 or 128 keys, the former variants 1 and 2);
// 64 keys and 16 warps of 16 at head_dim 256 (2.77 ms at b4 s2048 h16/8 against SDPA's 1.24).
void backward_mma(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                  const float* lse, const float* dsum, float* dq_acc, bf16* dk, bf16* dv, Stream s) {
  if (p.head_dim <= 64) launch_bwd<64, 128, 8, 2>(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv, s);
  else if (p.head_dim <= 128) launch_bwd<128, 128, 8, 2>(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv, s);
  else launch_bwd<256, 64, 16>(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv, s);
}

}  // namespace loom::cuda::flash
