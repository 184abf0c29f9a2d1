// CUDA entry points of kernels/attention.h. bf16 with head_dim % 8 == 0 and aligned pointers goes
// to the tensor-core flash kernels (flash_attention_{fwd,bwd}.cu). Everything else (f32, odd head
// dims) runs the row kernels here: one warp per query row (forward, dq) or per key row (dk, dv),
// lanes split over head_dim (lane l holds elements c * 32 + l), an online softmax in the forward,
// and probabilities recomputed from the saved lse in the backward; no atomics, so deterministic.
#include <algorithm>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/rope.h"

namespace loom::cuda {
namespace {

constexpr int kWarps = 4;  // warps per block, one row each
constexpr int kThreads = kWarps * 32;
constexpr int kMaxChunks = int(kAttentionMaxHeadDim / 32);
constexpr int kFwdTile = 4;  // keys scored together in the forward: independent shuffle chains
constexpr int kBwdTile = 2;  // rows scored together in the backward (two dot products each)

// x[c] = row[c * 32 + lane] in f32, 0 past head_dim.
template <int kC, class T>
__device__ __forceinline__ void load_row(const T* row, int d, int lane, float (&x)[kC]) {
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    const int e = c * 32 + lane;
    x[c] = e < d ? load(row + e) : 0.f;
  }
}

template <int kC, class T>
__device__ __forceinline__ void store_row(T* row, int d, int lane, const float (&x)[kC], float mul) {
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    const int e = c * 32 + lane;
    if (e < d) store(row + e, mul * x[c]);
  }
}

// This lane's share of a . b; warp_sum of it is the full dot product.
template <int kC>
__device__ __forceinline__ float partial_dot(const float (&a)[kC], const float (&b)[kC]) {
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kC; ++c) s += a[c] * b[c];
  return s;
}

// Scaled, optionally soft-capped logit from q.k; *dcap = d(capped) / d(scaled).
__device__ __forceinline__ float cap_logit(float dot, const AttentionParams& p, float* dcap) {
  const float s = p.scale * dot;
  if (p.softcap > 0.f) {
    const float t = tanhf(s / p.softcap);
    *dcap = 1.f - t * t;
    return p.softcap * t;
  }
  *dcap = 1.f;
  return s;
}

// Grid of ceil(batch * heads * seq / kWarps) blocks; warp -> (b, h, i) with i counting down so the
// longest rows start first.
template <class T, int kC>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(AttentionParams p, const T* q, const T* k, const T* v, T* out, float* lse) {
  const int lane = threadIdx.x & 31, d = int(p.head_dim);
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= p.batch * p.heads * p.seq) return;  // uniform over the warp
  const int64_t i = p.seq - 1 - row % p.seq, h = (row / p.seq) % p.heads, b = row / (p.seq * p.heads);
  const int64_t g = h / (p.heads / p.kv_heads), kv_step = p.kv_heads * p.head_dim;
  const T* kb = k + (b * p.seq * p.kv_heads + g) * p.head_dim;  // key j at kb + j * kv_step
  const T* vb = v + (b * p.seq * p.kv_heads + g) * p.head_dim;
  const int32_t* seg = p.segment_ids ? p.segment_ids + b * p.seq : nullptr;
  const int32_t seg_i = seg ? seg[i] : 0;
  const int64_t lo = p.window > 0 && i - p.window + 1 > 0 ? i - p.window + 1 : 0;

  float qv[kC], acc[kC];
  load_row(q + ((b * p.seq + i) * p.heads + h) * p.head_dim, d, lane, qv);
#pragma unroll
  for (int c = 0; c < kC; ++c) acc[c] = 0.f;
  float m = -INFINITY, l = 0.f;  // running max and sum of exp(s - m)
  for (int64_t j0 = lo; j0 <= i; j0 += kFwdTile) {
    float s[kFwdTile];
    bool vis[kFwdTile];
#pragma unroll
    for (int t = 0; t < kFwdTile; ++t) {  // visibility depends on j only: uniform over the warp
      const int64_t j = j0 + t;
      vis[t] = j <= i && (seg == nullptr || seg[j] == seg_i);
      float kr[kC];
      if (vis[t]) load_row(kb + j * kv_step, d, lane, kr);
      s[t] = vis[t] ? partial_dot(qv, kr) : 0.f;
    }
    float tile_max = -INFINITY;
#pragma unroll
    for (int t = 0; t < kFwdTile; ++t) {
      float dcap;
      s[t] = cap_logit(warp_sum(s[t]), p, &dcap);
      if (vis[t]) tile_max = nan_fmaxf(tile_max, s[t]);  // a NaN score makes the row NaN
    }
    if (tile_max == -INFINITY) continue;  // nothing visible in this tile
    const float m_new = nan_fmaxf(m, tile_max);
    const float corr = expf(m - m_new);  // 0 on the first visible tile (m = -inf)
    l *= corr;
#pragma unroll
    for (int c = 0; c < kC; ++c) acc[c] *= corr;
#pragma unroll
    for (int t = 0; t < kFwdTile; ++t) {
      if (!vis[t]) continue;
      const float w = expf(s[t] - m_new);
      l += w;
      float vr[kC];
      load_row(vb + (j0 + t) * kv_step, d, lane, vr);
#pragma unroll
      for (int c = 0; c < kC; ++c) acc[c] += w * vr[c];
    }
    m = m_new;
  }
  // A row with no visible key (impossible with causality) gets out = 0, lse = -inf; a NaN l (a NaN
  // or infinite score) stays NaN in both.
  store_row(out + ((b * p.seq + i) * p.heads + h) * p.head_dim, d, lane, acc, l == 0.f ? 0.f : 1.f / l);
  if (lane == 0) lse[(b * p.heads + h) * p.seq + i] = l == 0.f ? -INFINITY : m + logf(l);
}

// dq_i = scale * sum_j dS_ij k_j with dS_ij = P_ij (dout_i . v_j - D_i) * dcap_ij. Also writes
// D_i = dout_i . out_i to dsum [batch, heads, seq] for the dk/dv kernel. Same grid as the forward.
template <class T, int kC>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(AttentionParams p, const T* q, const T* k, const T* v, const T* out, const T* dout,
                        const float* lse, T* dq, float* dsum) {
  const int lane = threadIdx.x & 31, d = int(p.head_dim);
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= p.batch * p.heads * p.seq) return;
  const int64_t i = p.seq - 1 - row % p.seq, h = (row / p.seq) % p.heads, b = row / (p.seq * p.heads);
  const int64_t g = h / (p.heads / p.kv_heads), kv_step = p.kv_heads * p.head_dim;
  const T* kb = k + (b * p.seq * p.kv_heads + g) * p.head_dim;
  const T* vb = v + (b * p.seq * p.kv_heads + g) * p.head_dim;
  const int32_t* seg = p.segment_ids ? p.segment_ids + b * p.seq : nullptr;
  const int32_t seg_i = seg ? seg[i] : 0;
  const int64_t lo = p.window > 0 && i - p.window + 1 > 0 ? i - p.window + 1 : 0;
  const int64_t qoff = ((b * p.seq + i) * p.heads + h) * p.head_dim, roff = (b * p.heads + h) * p.seq + i;

  float qv[kC], dov[kC], acc[kC];
  load_row(q + qoff, d, lane, qv);
  load_row(dout + qoff, d, lane, dov);
  load_row(out + qoff, d, lane, acc);  // acc holds out_i until D is formed
  const float D = warp_sum(partial_dot(dov, acc));
  if (lane == 0) dsum[roff] = D;
#pragma unroll
  for (int c = 0; c < kC; ++c) acc[c] = 0.f;
  const float lse_i = lse[roff];
  if (lse_i != -INFINITY) {  // uniform; only a row without visible keys has lse = -inf
    for (int64_t j0 = lo; j0 <= i; j0 += kBwdTile) {
      float kr[kBwdTile][kC], sdot[kBwdTile], pdot[kBwdTile];
      bool vis[kBwdTile];
#pragma unroll
      for (int t = 0; t < kBwdTile; ++t) {
        const int64_t j = j0 + t;
        vis[t] = j <= i && (seg == nullptr || seg[j] == seg_i);
        float vr[kC];
        if (vis[t]) {
          load_row(kb + j * kv_step, d, lane, kr[t]);
          load_row(vb + j * kv_step, d, lane, vr);
        }
        sdot[t] = vis[t] ? partial_dot(qv, kr[t]) : 0.f;
        pdot[t] = vis[t] ? partial_dot(dov, vr) : 0.f;
      }
#pragma unroll
      for (int t = 0; t < kBwdTile; ++t) {
        sdot[t] = warp_sum(sdot[t]);
        pdot[t] = warp_sum(pdot[t]);
      }
#pragma unroll
      for (int t = 0; t < kBwdTile; ++t) {
        if (!vis[t]) continue;
        float dcap;
        const float prob = expf(cap_logit(sdot[t], p, &dcap) - lse_i);
        const float ds = prob * (pdot[t] - D) * dcap;
#pragma unroll
        for (int c = 0; c < kC; ++c) acc[c] += ds * kr[t][c];
      }
    }
  }
  store_row(dq + qoff, d, lane, acc, p.scale);
}

// dk_j = scale * sum_{h in group, i} dS_ij q_i and dv_j = sum_{h in group, i} P_ij dout_i, for
// queries i in [j, j + window) of the same segment. Grid of ceil(batch * kv_heads * seq / kWarps)
// blocks; warp -> (b, g, j) with j counting up, so the keys with the most queries start first.
template <class T, int kC>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(AttentionParams p, const T* q, const T* k, const T* v, const T* dout,
                          const float* lse, const float* dsum, T* dk, T* dv) {
  const int lane = threadIdx.x & 31, d = int(p.head_dim);
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= p.batch * p.kv_heads * p.seq) return;
  const int64_t j = row % p.seq, g = (row / p.seq) % p.kv_heads, b = row / (p.seq * p.kv_heads);
  const int64_t group = p.heads / p.kv_heads, q_step = p.heads * p.head_dim;
  const int32_t* seg = p.segment_ids ? p.segment_ids + b * p.seq : nullptr;
  const int32_t seg_j = seg ? seg[j] : 0;
  const int64_t hi = p.window > 0 && p.window < p.seq - j ? j + p.window : p.seq;  // queries [j, hi)
  const int64_t kvoff = ((b * p.seq + j) * p.kv_heads + g) * p.head_dim;

  float kr[kC], vr[kC], dka[kC], dva[kC];
  load_row(k + kvoff, d, lane, kr);
  load_row(v + kvoff, d, lane, vr);
#pragma unroll
  for (int c = 0; c < kC; ++c) dka[c] = dva[c] = 0.f;
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    const T* qb = q + (b * p.seq * p.heads + h) * p.head_dim;  // query i at qb + i * q_step
    const T* dob = dout + (b * p.seq * p.heads + h) * p.head_dim;
    const float* lse_h = lse + (b * p.heads + h) * p.seq;
    const float* dsum_h = dsum + (b * p.heads + h) * p.seq;
    for (int64_t i0 = j; i0 < hi; i0 += kBwdTile) {
      float qr[kBwdTile][kC], dor[kBwdTile][kC], sdot[kBwdTile], pdot[kBwdTile];
      bool vis[kBwdTile];
#pragma unroll
      for (int t = 0; t < kBwdTile; ++t) {
        const int64_t i = i0 + t;
        vis[t] = i < hi && (seg == nullptr || seg[i] == seg_j) && lse_h[i] != -INFINITY;
        if (vis[t]) {
          load_row(qb + i * q_step, d, lane, qr[t]);
          load_row(dob + i * q_step, d, lane, dor[t]);
        }
        sdot[t] = vis[t] ? partial_dot(qr[t], kr) : 0.f;
        pdot[t] = vis[t] ? partial_dot(dor[t], vr) : 0.f;
      }
#pragma unroll
      for (int t = 0; t < kBwdTile; ++t) {
        sdot[t] = warp_sum(sdot[t]);
        pdot[t] = warp_sum(pdot[t]);
      }
#pragma unroll
      for (int t = 0; t < kBwdTile; ++t) {
        if (!vis[t]) continue;
        float dcap;
        const float prob = expf(cap_logit(sdot[t], p, &dcap) - lse_h[i0 + t]);
        const float ds = prob * (pdot[t] - dsum_h[i0 + t]) * dcap;
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          dka[c] += ds * qr[t][c];
          dva[c] += prob * dor[t][c];
        }
      }
    }
  }
  store_row(dk + kvoff, d, lane, dka, p.scale);
  store_row(dv + kvoff, d, lane, dva, 1.f);
}

// Calls f(std::integral_constant<int, C>) for the C = chunks in [kC, kMaxChunks].
template <int kC = 1, class F>
void with_chunks(int chunks, F&& f) {
  if constexpr (kC <= kMaxChunks) {
    if (chunks == kC) f(std::integral_constant<int, kC>{});
    else with_chunks<kC + 1>(chunks, f);
  }
}

void check_cuda_params(const AttentionParams& p, const char* op) {
  check_attention_params(p, op);
  LOOM_CHECK(p.head_dim <= kAttentionMaxHeadDim, op, ": head_dim ", p.head_dim, " exceeds ",
             kAttentionMaxHeadDim);
}

unsigned blocks_for_rows(int64_t rows) { return static_cast<unsigned>((rows + kWarps - 1) / kWarps); }

}  // namespace

template <class T>
void attention_forward(const AttentionParams& p, const T* q, const T* k, const T* v, T* out, float* lse, Stream s) {
  check_cuda_params(p, "cuda::attention_forward");
  const int64_t rows = p.batch * p.heads * p.seq;
  if (rows == 0) return;
  if constexpr (std::is_same_v<T, bf16>) {
    if (flash::supported(p, q, k, v, out)) return flash::forward(p, q, k, v, out, lse, s);
  }
  with_chunks(int((p.head_dim + 31) / 32), [&](auto C) {
    attention_forward_kernel<T, decltype(C)::value><<<blocks_for_rows(rows), kThreads, 0, s>>>(p, q, k, v, out, lse);
  });
  LOOM_CUDA_LAUNCH_CHECK();
}

size_t attention_backward_workspace_bytes(const AttentionParams& p) {
  const size_t bytes = (size_t(p.batch * p.heads * p.seq) * sizeof(float) + 255) / 256 * 256;
  return p.head_dim % 8 == 0 ? std::max(bytes, flash::backward_workspace_bytes(p)) : bytes;
}

template <class T>
void attention_backward(const AttentionParams& p, const T* q, const T* k, const T* v, const T* out,
                        const T* dout, const float* lse, T* dq, T* dk, T* dv, void* workspace, Stream s,
                        const RopeOfQ* rope_q) {
  check_cuda_params(p, "cuda::attention_backward");
  const int64_t q_rows = p.batch * p.heads * p.seq, kv_rows = p.batch * p.kv_heads * p.seq;
  if (q_rows == 0) return;
  LOOM_CHECK(workspace != nullptr, "cuda::attention_backward needs attention_backward_workspace_bytes = ",
             attention_backward_workspace_bytes(p), " bytes of workspace");
  // q's rotation undone in the flash path's last pass where the whole head rotates, else after.
  bool rotated_back = false, use_flash = false;
  if constexpr (std::is_same_v<T, bf16>) {
    use_flash = flash::supported(p, q, k, v, out) && aligned16(dout) && aligned16(dq) && aligned16(dk) && aligned16(dv);
    if (use_flash) {
      rotated_back = rope_q && rope_q->rotary_dim == p.head_dim;
      flash::backward(p, q, k, v, out, dout, lse, dq, dk, dv, workspace, s, flash::Kernel::kAuto,
                      rotated_back ? rope_q : nullptr);
    }
  }
  if (!use_flash) {
    float* dsum = static_cast<float*>(workspace);
    with_chunks(int((p.head_dim + 31) / 32), [&](auto C) {
      constexpr int kC = decltype(C)::value;
      attention_dq_kernel<T, kC><<<blocks_for_rows(q_rows), kThreads, 0, s>>>(p, q, k, v, out, dout, lse, dq, dsum);
      LOOM_CUDA_LAUNCH_CHECK();
      attention_dkdv_kernel<T, kC><<<blocks_for_rows(kv_rows), kThreads, 0, s>>>(p, q, k, v, dout, lse, dsum, dk, dv);
    });
    LOOM_CUDA_LAUNCH_CHECK();
  }
  if (rope_q && !rotated_back)
    rope_backward(dq, dq, rope_q->positions, rope_q->inv_freq, p.batch * p.seq, p.heads, p.head_dim,
                  rope_q->rotary_dim, rope_q->mscale, s);
}

#define LOOM_INST(T)                                                                                        \
  template void attention_forward<T>(const AttentionParams&, const T*, const T*, const T*, T*, float*, Stream); \
  template void attention_backward<T>(const AttentionParams&, const T*, const T*, const T*, const T*, const T*, \
                                      const float*, T*, T*, T*, void*, Stream, const RopeOfQ*);
LOOM_INST(float)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cuda
