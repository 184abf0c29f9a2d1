// Flash attention forward (bf16, mma.sync m16n8k16): one block per (query tile of 16 * kWarps
// rows, head, batch row), each warp owning 16 query rows; head_dim padded with zeros to kD (the
// products run over the padding: straight-line loops the compiler can pipeline); key/value tiles of kBc rows stream through
// shared memory with cp.async (the next K tile loads while P V runs, V while Q K^T runs); online
// softmax in f32 and in log2 units; out and lse (natural log) written once.
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/flash_mask.cuh"

namespace loom::cuda::flash {
namespace {

template <int kD, int kWarps, int kBc, int kMT>
struct FwdConfig {
  static constexpr int kBr = 16 * kMT * kWarps, kThreads = 32 * kWarps;
  static constexpr size_t kSmem = size_t(kBr + 2 * kBc) * kD * sizeof(bf16);
};

template <int kD, int kWarps, int kBc, int kMT>
__global__ void __launch_bounds__(32 * kWarps)
    flash_fwd_kernel(AttentionParams p, const bf16* __restrict__ q, const bf16* __restrict__ k,
                     const bf16* __restrict__ v, bf16* __restrict__ out, float* __restrict__ lse) {
  constexpr int kBr = 16 * kMT * kWarps, kThreads = 32 * kWarps, kNt = kBc / 8, kDt = kD / 8;
  constexpr bool kQRegs = kMT == 1 && kD <= 128;  // else Q fragments are re-read from shared memory
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + kBr * kD;
  bf16* sV = sK + kBc * kD;

  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kBr;  // the longest rows start first
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const HeadRows rows(p, q, k, v, b, h);

  const int64_t k_end = q0 + kBr < p.seq ? q0 + kBr : p.seq;  // keys [k_begin, k_end) can be seen
  const int64_t k_begin = p.window > 0 && q0 - p.window + 1 > 0 ? q0 - p.window + 1 : 0;
  const int t_end = int((k_end + kBc - 1) / kBc);
  int32_t qs_lo = 0, qs_hi = 0;
  if (rows.seg) warp_seg_range(rows.seg, q0, kBr, p.seq, lane, &qs_lo, &qs_hi);

  load_tile<kBr, kD, kThreads>(sQ, rows.q, rows.q_stride, q0, p.seq, rows.hd);
  TileKind kind = TileKind::kSkip;
  int t = next_key_tile<kBr, kBc>(p, rows.seg, int(k_begin / kBc), t_end, q0, qs_lo, qs_hi, lane, &kind);
  if (t < t_end) load_tile<kBc, kD, kThreads>(sK, rows.k, rows.kv_stride, int64_t(t) * kBc, p.seq, rows.hd);
  cp_async_commit();

  const float scale_log2 = p.scale * kLog2e;
  const FragLane f16 = frag_rows16(lane), f8x2 = frag_rows8x2(lane);
  const int wrow = warp * 16 * kMT;  // this warp's first row in the tile
  // Thread rows: q0 + wrow + 16 mt + lane / 4 (+ 8 for r = 1).
  auto row_of = [&](int mt, int r) { return q0 + wrow + 16 * mt + (lane >> 2) + 8 * r; };
  float m[kMT][2], l[kMT][2], o[kMT][kDt][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
    for (int n = 0; n < kDt; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  }
  uint32_t qf[kQRegs ? kD / 16 : 1][4];
  bool q_loaded = false;

  while (t < t_end) {
    const int64_t k0 = int64_t(t) * kBc;
    load_tile<kBc, kD, kThreads>(sV, rows.v, rows.kv_stride, k0, p.seq, rows.hd);
    cp_async_commit();
    cp_async_wait<1>();  // Q and this K tile have landed
    __syncthreads();
    if constexpr (kQRegs) {
      if (!q_loaded) {
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk) load_a<kD>(qf[kk], sQ, wrow, kk * 16, f16);
        q_loaded = true;
      }
    }
    // S = Q K^T for this warp's 16 kMT rows x kBc keys; each K fragment serves kMT row tiles.
    float s[kMT][kNt][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int n = 0; n < kNt; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (kQRegs) {
          a[mt][0] = qf[kk][0], a[mt][1] = qf[kk][1], a[mt][2] = qf[kk][2], a[mt][3] = qf[kk][3];
        } else {
          load_a<kD>(a[mt], sQ, wrow + 16 * mt, kk * 16, f16);
        }
      }
#pragma unroll
      for (int n = 0; n < kNt; n += 2) {
        uint32_t bf[4];
        load_b_nk<kD>(bf, sK, n * 8, kk * 16, f8x2);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma16816(s[mt][n], a[mt], bf[0], bf[1]);
          mma16816(s[mt][n + 1], a[mt], bf[2], bf[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with sK
    TileKind next_kind = TileKind::kSkip;
    const int t_next = next_key_tile<kBr, kBc>(p, rows.seg, t + 1, t_end, q0, qs_lo, qs_hi, lane, &next_kind);
    if (t_next < t_end) load_tile<kBc, kD, kThreads>(sK, rows.k, rows.kv_stride, int64_t(t_next) * kBc, p.seq, rows.hd);
    cp_async_commit();

    // Soft-cap and mask in dot-product units (scale > 0, so maxima commute with the scaling), then
    // the online softmax in log2 units: p = 2^(s * scale * log2(e) - m * scale * log2(e)).
    if (p.softcap > 0.f) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int n = 0; n < kNt; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float dcap;
            s[mt][n][e] = cap_dot(s[mt][n][e], p.scale, p.softcap, &dcap);
          }
    }
    if (kind == TileKind::kMasked) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int n = 0; n < kNt; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!rows.vis(row_of(mt, e >> 1), k0 + n * 8 + 2 * (lane & 3) + (e & 1))) s[mt][n][e] = -INFINITY;
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < kNt; ++n) mx = nan_fmaxf(mx, nan_fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
        mx = nan_fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // a NaN score makes the row NaN
        mx = nan_fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = nan_fmaxf(m[mt][r], mx);
        const float mu = mn == -INFINITY ? 0.f : mn;
        const float corr = fast_exp2((m[mt][r] - mu) * scale_log2);  // 0 while nothing was visible
        const float nb = -mu * scale_log2;
        m[mt][r] = mn;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < kNt; ++n) {
          s[mt][n][2 * r] = fast_exp2(fmaf(s[mt][n][2 * r], scale_log2, nb));
          s[mt][n][2 * r + 1] = fast_exp2(fmaf(s[mt][n][2 * r + 1], scale_log2, nb));
          sum += s[mt][n][2 * r] + s[mt][n][2 * r + 1];
        }
        l[mt][r] = l[mt][r] * corr + sum;
#pragma unroll
        for (int n = 0; n < kDt; ++n) {
          o[mt][n][2 * r] *= corr;
          o[mt][n][2 * r + 1] *= corr;
        }
      }
    }

    if (t_next < t_end) cp_async_wait<1>();  // this V tile has landed (the next K may not)
    else cp_async_wait<0>();
    __syncthreads();
    // O += P V: P from the S accumulators (their layout is the A fragment's), V as B.
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        a[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int n = 0; n < kDt; n += 2) {
        uint32_t bf[4];
        load_b_kn<kD>(bf, sV, kk * 16, n * 8, f16);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma16816(o[mt][n], a[mt], bf[0], bf[1]);
          mma16816(o[mt][n + 1], a[mt], bf[2], bf[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with sV before the next tile overwrites it
    t = t_next;
    kind = next_kind;
  }
  cp_async_wait<0>();

  // Row sums across the quad, then out = O / l and lse = ln(sum exp(z)).
  const int col0 = 2 * (lane & 3);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum == 0.f ? 0.f : 1.f / sum;  // a NaN sum stays NaN
      const int64_t i = row_of(mt, r);
      if (i >= p.seq) continue;
      bf16* orow = out + (b * p.seq + i) * rows.q_stride + h * p.head_dim;
#pragma unroll
      for (int n = 0; n < kDt; ++n) {
        const int col = n * 8 + col0;
        if (col < rows.hd)
          *reinterpret_cast<__nv_bfloat162*>(orow + col) =
              __floats2bfloat162_rn(o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
      }
      if ((lane & 3) == 0)
        lse[(b * p.heads + h) * p.seq + i] = sum == 0.f ? -INFINITY : m[mt][r] * p.scale + logf(sum);
    }
  }
}

template <int kD, int kWarps, int kBc, int kMT>
void launch_fwd(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,
                Stream s) {
  using C = FwdConfig<kD, kWarps, kBc, kMT>;
  auto* kernel = flash_fwd_kernel<kD, kWarps, kBc, kMT>;
  allow_dynamic_smem<flash_fwd_kernel<kD, kWarps, kBc, kMT>>(C::kSmem);
  const dim3 grid(unsigned((p.seq + C::kBr - 1) / C::kBr), unsigned(p.heads), unsigned(p.batch));
  kernel<<<grid, C::kThreads, C::kSmem, s>>>(p, q, k, v, out, lse);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace

// Tile shapes: 4 warps x 32 rows and 64 keys (FlashAttention-2's shape; at head_dim 128 it spills
// ~250 bytes and is still the fastest mma.sync shape: 574 us against 631 for 32 keys and more for
// 16-row warps, b4 s2048 h32/8, H200, 2026-12-02); 4 warps x 16 rows and 32 keys at head_dim 256.
void forward_mma(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,
                 Stream s) {
  if (p.head_dim <= 64) launch_fwd<64, 4, 64, 2>(p, q, k, v, out, lse, s);
  else if (p.head_dim <= 128) launch_fwd<128, 4, 64, 2>(p, q, k, v, out, lse, s);
  else launch_fwd<256, 4, 32, 1>(p, q, k, v, out, lse, s);
}

}  // namespace loom::cuda::flash
