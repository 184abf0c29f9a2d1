// Causal scaled-dot-product attention, forward and backward, with grouped-query heads, Gemma 2
// logit soft-capping, sliding windows and packed-document segment masks. T is float, double (CPU
// only) or bf16; scores, softmax and every reduction are computed in Acc<T>.
#pragma once
#include <cstdint>
#include <cstddef>

#include "kernels/common.h"

namespace loom {

// Shapes: q [batch, seq, heads, head_dim]; k, v [batch, seq, kv_heads, head_dim];
// out [batch, seq, heads, head_dim]; lse [batch, heads, seq] (Acc<T>).
// Query i sees key j when j <= i (causal), and i - j < window (if window > 0), and
// segment_ids[b, i] == segment_ids[b, j] (if segment_ids is set).
struct AttentionParams {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;  // heads % kv_heads == 0;
                                 // head h reads kv head h / (heads / kv_heads)
  float scale = 1.f;             // multiplies q.k: 1/sqrt(head_dim), or query_pre_attn_scalar^-0.5
  float softcap = 0.f;           // 0 = off; else s = softcap * tanh(s / softcap) on the scaled logits
  int64_t window = 0;            // 0 = off; else key j visible to query i only if i - j < window
  const int32_t* segment_ids = nullptr;  // [batch, seq] or null; same memory space as the tensors
};

// q's rotary embedding (kernels/rope.h's arguments), for a backward that returns the gradient of q
// before it rotated: dq is rope_backward of attention's dq (the CPU, and the CUDA flash path in the
// pass that finishes dq: one rounding to T; CUDA's row kernels, rope_backward after).
struct RopeOfQ {
  const int32_t* positions = nullptr;  // [batch * seq]
  const float* inv_freq = nullptr;     // [rotary_dim / 2]
  int64_t rotary_dim = 0;              // even, <= head_dim
  float mscale = 1.f;
};

// A window no shorter than the sequence hides nothing (i - j < seq <= window for every causal pair):
// the same attention without one, which the fastest kernels take (Phi-3.5's 262,144-token window,
// Mistral's 4096 over rows of 2048).
// (A negative window is left for check_attention_params to refuse.)
inline int64_t effective_window(int64_t window, int64_t seq) { return window >= seq && window > 0 ? 0 : window; }

// Throws loom::Error naming op and the offending field when p cannot describe an attention.
inline void check_attention_params(const AttentionParams& p, const char* op) {
  LOOM_CHECK(p.batch >= 0 && p.seq >= 0 && p.heads > 0 && p.kv_heads > 0 && p.head_dim > 0, op,
             ": bad shape batch=", p.batch, " seq=", p.seq, " heads=", p.heads, " kv_heads=", p.kv_heads,
             " head_dim=", p.head_dim);
  LOOM_CHECK(p.heads % p.kv_heads == 0, op, ": heads (", p.heads, ") must be a multiple of kv_heads (",
             p.kv_heads, ")");
  LOOM_CHECK(p.window >= 0, op, ": window must be >= 0, got ", p.window);
  LOOM_CHECK(p.softcap >= 0.f, op, ": softcap must be >= 0 (0 = off), got ", p.softcap);
}

}  // namespace loom

namespace loom::cpu {
// out = softmax(mask(cap(scale * q k^T))) v per (batch, head); lse = log-sum-exp of each row's
// visible (capped) logits, saved for backward.
template <class T>
void attention_forward(const AttentionParams& p, const T* q, const T* k, const T* v, T* out, Acc<T>* lse);
// dq, dk, dv (overwritten) from dout, the forward's out and lse. dk, dv sum over the query heads
// of each group. rope_q: dq is the gradient of q before its rotation (RopeOfQ), rotated back in
// the accumulator's precision and rounded once, as CUDA's flash path does.
template <class T>
void attention_backward(const AttentionParams& p, const T* q, const T* k, const T* v, const T* out,
                        const T* dout, const Acc<T>* lse, T* dq, T* dk, T* dv, const RopeOfQ* rope_q = nullptr);
}  // namespace loom::cpu

namespace loom::cuda {
// Largest head_dim the CUDA kernels take.
inline constexpr int64_t kAttentionMaxHeadDim = 256;
template <class T>
void attention_forward(const AttentionParams& p, const T* q, const T* k, const T* v, T* out, float* lse, Stream s);
// bf16 calls with head_dim % 8 == 0 and 16-byte-aligned pointers run the flash kernels (tensor
// cores, tiles in shared memory, memory linear in seq; dq is summed with f32 atomics, so the
// backward is not bit-reproducible); the rest run one warp per row.
// Scratch for attention_backward: D_i = dout_i . out_i per (batch, head, query), plus an f32 dq
// accumulator [batch, seq, heads, head_dim] when the flash path may run.
size_t attention_backward_workspace_bytes(const AttentionParams& p);
// rope_q: dq is the gradient of q before its rotation (RopeOfQ).
template <class T>
void attention_backward(const AttentionParams& p, const T* q, const T* k, const T* v, const T* out,
                        const T* dout, const float* lse, T* dq, T* dk, T* dv, void* workspace, Stream s,
                        const RopeOfQ* rope_q = nullptr);
}  // namespace loom::cuda
