// The flash-attention dispatch: which kernel runs a problem (by architecture, head_dim and masking
// features, with the measurements that settled it), the backward's preparation (D_i = dout_i .
// out_i, a zeroed f32 dq accumulator) and its last pass (dq = scale * dq_acc in bf16, or with q's rope
// undone in the same pass: dq_finish_rope_kernel).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/rope_angles.cuh"

namespace loom::cuda::flash {
namespace {

// D_i = dout_i . out_i (f32) for every (batch, head, query): `group` lanes per row (a power of two
// <= 32 with group * 8 >= head_dim, or 32 looping over longer rows), 8 elements per lane; the row's
// dq_acc (same [batch, seq, heads, head_dim] layout) is zeroed on the way (instead of a memset).
// Groups of a few lanes keep every lane busy at head_dim 64 (8 lanes a row, 4 rows a warp), where
// a warp per row left three quarters of it idle.
__global__ void dsum_kernel(AttentionParams p, const bf16* __restrict__ out, const bf16* __restrict__ dout,
                            float* __restrict__ dsum, float* __restrict__ dq_acc, int group) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = t / group;  // (b, i, h) as in q
  const int sub = int(t % group);
  const bool valid = row < p.batch * p.seq * p.heads;
  float acc = 0.f;
  if (valid) {
    const bf16* o = out + row * p.head_dim;
    const bf16* d = dout + row * p.head_dim;
    float* z = dq_acc + row * p.head_dim;
    for (int64_t c = int64_t(sub) * 8; c < p.head_dim; c += int64_t(group) * 8) {
      reinterpret_cast<float4*>(z + c)[0] = make_float4(0.f, 0.f, 0.f, 0.f);
      reinterpret_cast<float4*>(z + c)[1] = make_float4(0.f, 0.f, 0.f, 0.f);
      float a[8], bb[8];
      load_vec<8>(o + c, a);
      load_vec<8>(d + c, bb);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc += a[e] * bb[e];
    }
  }
  for (int off = group / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);  // whole warp
  if (valid && sub == 0) {
    const int64_t h = row % p.heads, i = (row / p.heads) % p.seq, b = row / (p.heads * p.seq);
    dsum[(b * p.heads + h) * p.seq + i] = acc;
  }
}

// dq = scale * dq_acc, rounded to bf16; n a multiple of 8.
__global__ void dq_finish_kernel(const float* __restrict__ acc, bf16* __restrict__ dq, int64_t n, float scale) {
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (i >= n) return;
  float v[8];
  load_vec<8>(acc + i, v);
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] *= scale;
  store_vec<8>(dq + i, v);
}

// dq = rope_backward(scale * dq_acc) in one pass (RopeOfQ, the whole head rotating): thread (token t,
// frequencies 4 j .. 4 j + 3) computes its angles' sine and cosine once, as the rope kernels do
// (rope_angles.cuh), and takes both halves of those columns in every head; dq is rounded once, where
// dq_finish then the rope kernel rounded twice.
__global__ void dq_finish_rope_kernel(const float* __restrict__ acc, bf16* __restrict__ dq, int64_t tokens,
                                      int64_t heads, int64_t half, float scale, const int32_t* __restrict__ positions,
                                      const float* __restrict__ inv_freq, float mscale) {
  constexpr int V = 4;
  const int64_t groups = half / V, idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t t = idx / groups, j = idx % groups;
  if (t >= tokens) return;
  const float pos = static_cast<float>(positions[t]);
  float c[V], sn[V];
  rope_angles<-1, V>(pos, inv_freq + j * V, mscale, c, sn);  // the transpose of the forward rotation
  const int64_t head_dim = 2 * half;
#pragma unroll 4
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t base = (t * heads + h) * head_dim + j * V;
    float x1[V], x2[V], y1[V], y2[V];
    load_vec<V>(acc + base, x1);
    load_vec<V>(acc + base + half, x2);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      x1[e] *= scale, x2[e] *= scale;
      y1[e] = x1[e] * c[e] - x2[e] * sn[e];
      y2[e] = x2[e] * c[e] + x1[e] * sn[e];
    }
    store_vec<V>(dq + base, y1);
    store_vec<V>(dq + base + half, y2);
  }
}

size_t dsum_bytes(const AttentionParams& p) { return (size_t(p.batch * p.heads * p.seq) * 4 + 255) / 256 * 256; }

}  // namespace

bool supported(const AttentionParams& p, const void* q, const void* k, const void* v, const void* out) {
  return p.scale > 0.f && p.head_dim % 8 == 0 && p.head_dim <= 256 && aligned16(q) && aligned16(k) && aligned16(v) &&
         aligned16(out);
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::kAuto: return "auto";
    case Kernel::kMma: return "mma";
    case Kernel::kSm90: return "sm90";
    case Kernel::kSm90Ws: return "sm90_ws";
    case Kernel::kSm90WsPersistent: return "sm90_ws_persistent";
  }
  return "?";
}

bool runs(Kernel kernel, const AttentionParams& p, bool backward) {
  switch (kernel) {
    case Kernel::kAuto:
    case Kernel::kMma: return true;
    case Kernel::kSm90: return sm90_ready();  // head_dim <= 256 (supported()); the backward in two kernels
    case Kernel::kSm90Ws: return sm90_ready() && (backward ? sm90_ws_bwd_supported(p) : sm90_ws_supported(p));
    case Kernel::kSm90WsPersistent: return sm90_ready() && !backward && sm90_ws_supported(p);
  }
  return false;
}

// Forward. H200, b4 s2048 h32/8 causal, PyTorch SDPA in the same run (2026-12-05, session 36,
// bench/results/session36): head_dim 128 sm90_ws_persistent 305 us, sm90_ws 323, sm90 421, mma 571
// (SDPA 290); head_dim 64: 215, 233, 311 (SDPA 191); head_dim 256 (h16/8): 304, 306, 398 (SDPA 270).
// Windows: b1 s8192 d128 w4096 sm90_ws 781 us and persistent 780, sm90 1131 (SDPA with its mask
// 3480); Gemma 3's sliding layer b4 s2048 h8/4 d256 w1024: sm90_ws 128 us, persistent 132, sm90
// 186. So the warp-specialised kernel wherever it applies (head_dim 64..256, no soft-cap or
// segments), launched persistent (one block per SM walking the query tiles, longest first) for
// plain causal attention, one block per tile with a window (whose tiles are all about as long); sm90
// for soft-capping, packed documents and head_dim below 64; mma off sm_90a.
Kernel forward_kernel(const AttentionParams& p) {
  if (!sm90_ready()) return Kernel::kMma;
  if (!sm90_ws_supported(p)) return Kernel::kSm90;
  return p.window > 0 ? Kernel::kSm90Ws : Kernel::kSm90WsPersistent;
}

// Backward. H200 (session 36, as above): b4 s2048 h32/8 head_dim 128 sm90_ws 1018 us, sm90 1411,
// mma 2423 (SDPA 983); head_dim 64 sm90_ws 628, sm90 1148 (SDPA 640); b1 s8192 d128 w4096 sm90_ws
// 2492 us, sm90 3718 (SDPA 9464). sm90_ws covers causal attention with or without a window at
// head_dim 64..256; sm90 every feature; mma off sm_90a. Session 40 (bench/results/session40, SDPA in
// the same run): b4 s2048 h32/8 head_dim 128 sm90_ws 908 us, sm90 1403 (SDPA 977); head_dim 64 578,
// 1102 (SDPA 657); head_dim 256 (h16/8) sm90_ws 1257 us, sm90 1603, mma 2770 (SDPA 1237). So sm90_ws
// wherever it applies, its head_dim 129..256 kernel (flash_attention_bwd_sm90_ws_d256.cu) included.
Kernel backward_kernel(const AttentionParams& p) {
  if (!sm90_ready()) return Kernel::kMma;
  return sm90_ws_bwd_supported(p) ? Kernel::kSm90Ws : Kernel::kSm90;
}

void forward(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse, Stream s,
             Kernel kernel) {
  if (p.batch == 0 || p.seq == 0) return;
  if (kernel == Kernel::kAuto) kernel = forward_kernel(p);
  LOOM_CHECK(runs(kernel, p, false), "flash forward: kernel ", kernel_name(kernel), " cannot run head_dim ", p.head_dim,
             " softcap ", p.softcap, " window ", p.window, p.segment_ids ? " with segments" : "", " on this device");
  switch (kernel) {
    case Kernel::kSm90Ws: return forward_sm90_ws(p, q, k, v, out, lse, s);
    case Kernel::kSm90WsPersistent: return forward_sm90_ws(p, q, k, v, out, lse, s, sm_count());
    case Kernel::kSm90: return forward_sm90(p, q, k, v, out, lse, s);
    default: return forward_mma(p, q, k, v, out, lse, s);
  }
}

size_t backward_workspace_bytes(const AttentionParams& p) {
  return dsum_bytes(p) + size_t(p.batch * p.seq * p.heads * p.head_dim) * sizeof(float);
}

void backward(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* out,
              const bf16* dout, const float* lse, bf16* dq, bf16* dk, bf16* dv, void* workspace, Stream s,
              Kernel kernel, const RopeOfQ* rope_q) {
  LOOM_CHECK(!rope_q || (rope_q->rotary_dim == p.head_dim && rope_q->positions && rope_q->inv_freq),
             "flash backward: q's rotation must cover the whole head (rotary_dim ", rope_q ? rope_q->rotary_dim : 0,
             ", head_dim ", p.head_dim, ")");
  if (p.batch == 0 || p.seq == 0) return;
  if (kernel == Kernel::kAuto) kernel = backward_kernel(p);
  LOOM_CHECK(runs(kernel, p, true), "flash backward: kernel ", kernel_name(kernel), " cannot run head_dim ",
             p.head_dim, " softcap ", p.softcap, " window ", p.window, p.segment_ids ? " with segments" : "",
             " on this device");
  float* dsum = static_cast<float*>(workspace);
  float* dq_acc = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + dsum_bytes(p));
  const int64_t n_q = p.batch * p.seq * p.heads * p.head_dim, rows = p.batch * p.seq * p.heads;
  int group = 1;
  while (group < 32 && group * 8 < p.head_dim) group *= 2;
  const int64_t dsum_threads = rows * group;
  dsum_kernel<<<unsigned((dsum_threads + 255) / 256), 256, 0, s>>>(p, out, dout, dsum, dq_acc, group);  // zeroes dq_acc
  LOOM_CUDA_LAUNCH_CHECK();
  switch (kernel) {
    case Kernel::kSm90Ws: backward_sm90_ws(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv, s); break;
    case Kernel::kSm90:
      if (p.head_dim <= 128) backward_sm90(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv, s);
      else backward_sm90_d256(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv, s);
      break;
    default: backward_mma(p, q, k, v, dout, lse, dsum, dq_acc, dk, dv, s); break;
  }
  if (rope_q) {  // head_dim a multiple of 8 (supported()): half a multiple of 4
    const int64_t tokens = p.batch * p.seq, half = p.head_dim / 2, threads = tokens * (half / 4);
    dq_finish_rope_kernel<<<unsigned((threads + 255) / 256), 256, 0, s>>>(dq_acc, dq, tokens, p.heads, half, p.scale,
                                                                        rope_q->positions, rope_q->inv_freq,
                                                                        rope_q->mscale);
  } else {
    dq_finish_kernel<<<unsigned((n_q / 8 + 255) / 256), 256, 0, s>>>(dq_acc, dq, n_q, p.scale);
  }
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace loom::cuda::flash
