// ops::: shape- and dtype-checked tensor functions. Each allocates its outputs on its inputs'
// device and dispatches to the CPU reference kernel or the CUDA kernel. Misuse (mismatched
// shapes, dtypes or devices) throws loom::Error naming the op and the tensors.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace loom {
struct AdamWParams;  // kernels/adamw.h
}  // namespace loom

namespace loom::ops {

// The accumulation dtype for a float dtype: f64 for f64, f32 otherwise (statistics, LSE, grads
// of frozen-dtype weights).
DType acc_dtype(DType t);

// ---- elementwise and reductions (same shape, dtype and device) ----
Tensor axpby(const Tensor& a, const Tensor& b, float alpha, float beta);  // alpha*a + beta*b
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& a, float s);
void add_(Tensor& dst, const Tensor& src);  // dst += src, in place (gradient accumulation)
void fill_(Tensor& t, float value);
// t[b] = beta * t[b] in place for each index b of t's first dimension listed in `blocks` (t contiguous):
// one launch for all of them; beta 0 writes zeros without reading, beta 1 does nothing.
void scale_blocks_(Tensor& t, const std::vector<int64_t>& blocks, float beta);
// The parts [..., n_i] (same leading shape, dtype and device; undefined = zeros of `widths[i]`
// columns) side by side along the last dim: [..., sum n_i]. One strided 2-D copy per part.
Tensor cat_last(const std::vector<Tensor>& parts, const std::vector<int64_t>& widths);
// dst [rows, C] (its rows any stride apart, columns contiguous: a narrow of wider rows) <- src
// [rows, C] of the same dtype and device: one strided 2-D copy.
void copy_rows_(Tensor& dst, const Tensor& src);
Tensor add_bias(const Tensor& a, const Tensor& bias);  // a [..., C] + bias [C]
// Column sums of a viewed as [rows, C] (C = last dim): into a new tensor of dtype `out`, or
// accumulated into `into` ([C], f32 or a's dtype).
Tensor sum_rows(const Tensor& a, DType out);
void sum_rows_into(const Tensor& a, Tensor& into);
// cap * tanh(a / cap) and its backward (Gemma 2 final-logit soft-capping).
Tensor softcap(const Tensor& a, float cap);
Tensor softcap_backward(const Tensor& a, const Tensor& dout, float cap);
// Scalars (f32, shape []) on a's device.
Tensor sum(const Tensor& a);
Tensor sum_squares(const Tensor& a);
// f32 [2] on the gradients' device (all on one; the CPU when none is defined): the global norm
// sqrt(sum over grads of sum(g^2)) and torch.nn.utils.clip_grad_norm_'s coefficient
// min(max_norm / (norm + 1e-6), 1) (NaN kept). Undefined tensors are skipped. On CUDA a few
// launches for all of them (kernels/grad_norm.h) and nothing read back; on the CPU per-tensor sums
// added in f32.
Tensor grad_norm_coef(const std::vector<Tensor>& grads, float max_norm);

// Whether ops:: products time cuBLASLt's first few algorithms on each shape's first call and keep the
// fastest (cuda::GemmAlgoChoice::kTimed), like torch.backends.cudnn.benchmark: off by default, since a
// run's bits then depend on which algorithm won a timing; `loom train --gemm-autotune` turns it on for
// the process, for every product that follows.
void set_gemm_autotune(bool on);
bool gemm_autotune();

// ---- matrix products (f32 accumulation) ----
// a [..., m, k] (or [..., k, m] with trans_a) times b [k, n] (or [n, k] with trans_b), b either
// 2-D (shared) or batched like a. Output dtype defaults to a's.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false,
              std::optional<DType> out_dtype = std::nullopt);
// c = alpha * op(a) op(b) + beta * c, c preallocated (accumulate with beta = 1): contiguous, or a 2-D
// matrix whose rows lie a pitch apart. With c_in (c's shape, dtype and strides; apart from c, or c
// itself): c = alpha * op(a) op(b) + beta * c_in, c_in left alone (one pass: GEMM's C and D).
void matmul_into(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, float alpha = 1.f,
                 float beta = 0.f, const Tensor* c_in = nullptr);
// x [..., in] times w [out, in]^T -> [..., out]   (torch.nn.functional.linear without bias)
Tensor linear(const Tensor& x, const Tensor& w, std::optional<DType> out_dtype = std::nullopt);
// Grouped products of mixture-of-experts layers (engine/ops_grouped.cpp): rows [offsets[e],
// offsets[e + 1]) belong to expert e (E + 1 host offsets from 0 to N). a and b share a dtype (f32,
// bf16, or f64 on the CPU); c has theirs, or f32 with bf16 inputs; f32 accumulation (as matmul_into).
// On CUDA one cublasGemmGroupedBatchedEx call or one cuBLASLt call per expert (kernels/grouped_gemm.h).
// Row-grouped: c[rows_e] = alpha * a[rows_e] op(b[e]) + beta * c[rows_e]; a [N, K], b [E, K, M]
// ([E, M, K] with trans_b), c [N, M] preallocated. Experts without rows are skipped.
void grouped_matmul_into(const Tensor& a, const Tensor& b, Tensor& c, const std::vector<int64_t>& offsets,
                         bool trans_b, float alpha = 1.f, float beta = 0.f);
// Two row-grouped products into one output: c[rows_e] = alpha * (a[rows_e] op(b[e]) + a2[rows_e]
// op(b2[e])) + beta * c[rows_e]; a2 [N, K2], b2 [E, K2, M] ([E, M, K2] with trans_b), the same
// dtypes (a LoRA adapter's term t' B^T folded into its base product x W^T). On sm_90a one launch of
// Loom's Hopper kernel when the rule picks it for the first product, else the two in turn.
void grouped_matmul_dual_into(const Tensor& a, const Tensor& b, const Tensor& a2, const Tensor& b2, Tensor& c,
                              const std::vector<int64_t>& offsets, bool trans_b, float alpha = 1.f, float beta = 0.f);
// Reduction-grouped (weight gradients): c[e] = alpha * a[rows_e]^T b[rows_e] + beta * c[e]; a [N, M],
// b [N, K], c [E, M, K] preallocated; an expert without rows gets beta * c[e] (0 when beta = 0).
void grouped_matmul_tn_into(const Tensor& a, const Tensor& b, Tensor& c, const std::vector<int64_t>& offsets,
                            float alpha = 1.f, float beta = 0.f);
// f32 x [rows, k] -> bf16 [rows, len(pattern) * k]: block p holds x's hi ('h': bf16(x)) or lo ('l':
// bf16(x - hi)) part (kernels/bf16_split.h), for products at nearly f32 precision through bf16 GEMMs.
// into: a [rows, count * k] bf16 view whose rows may lie further apart (a weight's spare columns)
// to write the parts into instead of a new tensor; returned.
Tensor bf16_split(const Tensor& x, const std::string& pattern, Tensor* into = nullptr);
// f32 in [rows, m * k] -> f32 [rows, k]: alpha times the sum of the m blocks of each row.
Tensor block_sum(const Tensor& in, int m, float alpha = 1.f);
// bf16_split(block_sum(in, m, alpha), pattern) for one or two patterns, in one pass (the same bits but
// for the sign of a zero sum: kernels/bf16_split.h).
// into_a, into_b: the first and second pattern's parts go there ([rows, count * k] bf16, rows any pitch
// apart: x's spare columns, one adapter's columns of several) instead of new tensors. in's rows may be
// any pitch apart too (one adapter's columns of a product for several, ag::lora_linears).
std::vector<Tensor> block_sum_split(const Tensor& in, int m, float alpha, const std::vector<std::string>& patterns,
                                    Tensor* into_a = nullptr, Tensor* into_b = nullptr);
// One block_sum_split of a batch: in [rows, m * k] f32, its parts by pattern a into out_a and, where b
// is not empty, by b into out_b (both given: [rows, count * k] bf16, rows any pitch apart).
struct SplitJob {
  Tensor in;
  int m = 1;
  float alpha = 1.f;
  std::string a;
  Tensor out_a;
  std::string b;
  Tensor out_b;
};
// Every job as block_sum_split would run it (the same bits), on CUDA in one launch (up to 12 jobs a
// launch): the LoRA products' splits of their parameters, a few small matrices each.
void block_sum_split_batch(const std::vector<SplitJob>& jobs);

// ---- normalization, position, activation, lookup ----
struct RmsNormOut {
  Tensor y;     // like x
  Tensor rstd;  // acc dtype, [rows]
};
// x [..., C], w [C]; add_one: Gemma's (1 + w). spare > 0: y is a view of the first C columns of a
// [..., C + spare] buffer, its rows C + spare apart, the spare columns left for a LoRA product to
// put its adapter input beside y (ag::LoraArgs::x_spare; see rows_of and widen_rows below).
RmsNormOut rms_norm(const Tensor& x, const Tensor& w, float eps, bool add_one, int64_t spare = 0);
// h = x + r (the residual add) and rms_norm(h), in one pass on CUDA (the same bits as add, then
// rms_norm).
struct AddRmsNormOut {
  Tensor h;     // x + r
  Tensor y;     // rms_norm(h)
  Tensor rstd;  // acc dtype, [rows]
};
AddRmsNormOut add_rms_norm(const Tensor& x, const Tensor& r, const Tensor& w, float eps, bool add_one,
                           int64_t spare = 0);
// x [..., C] as [rows, C]: a view when its rows are evenly strided (contiguous, or a norm's output
// with spare columns), else a contiguous copy.
Tensor rows_of(const Tensor& x);
// The [rows, C + extra] view of a [rows, C] row-strided x and the `extra` columns after each row, or
// an undefined tensor where its rows are not that far apart or its storage ends sooner.
Tensor widen_rows(const Tensor& x, int64_t extra);
// Returns dx; accumulates into *dw (acc dtype, [C]) when dw is non-null. dres (nullable, like x):
// a gradient x gets by another path, added to dx (in the same pass on CUDA; the bits of add(dres, dx)).
Tensor rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor* dw,
                         bool add_one, const Tensor* dres = nullptr);

// x [batch, seq, heads, head_dim] (or [tokens, heads, head_dim]); positions i32 [batch*seq];
// inv_freq f32 [rotary_dim/2]: the first rotary_dim (<= head_dim) entries of each head rotate, the rest
// pass through (partial_rotary_factor). cos and sin are scaled by mscale (LongRoPE's attention
// scaling). Hugging Face rotate-half layout.
Tensor rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float mscale = 1.f);
Tensor rope_backward(const Tensor& dy, const Tensor& positions, const Tensor& inv_freq, float mscale = 1.f);
// rope (or rope_backward) of q and of k, which share tokens, positions and head_dim: one launch on
// CUDA (the same bits as two). Either may be undefined (then its result is too).
std::pair<Tensor, Tensor> rope_pair(const Tensor& q, const Tensor& k, const Tensor& positions, const Tensor& inv_freq,
                                    bool backward, float mscale = 1.f);
// The default (unscaled) inverse frequencies as an f32 tensor on device (models/rope_scaling.h scales them).
Tensor rope_inv_freq(int64_t head_dim, double theta, Device device);

Tensor swiglu(const Tensor& gate, const Tensor& up);  // silu(gate) * up
std::pair<Tensor, Tensor> swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout);
Tensor geglu(const Tensor& gate, const Tensor& up);  // gelu_tanh(gate) * up
std::pair<Tensor, Tensor> geglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout);
// The same gradients, consuming gate and up: each one that is contiguous and the only holder of its
// storage (moved in, nothing else sharing it) receives its gradient in place, so a backward that
// saved [tokens, intermediate] activations needs no second pair of that size; the others are copied.
std::pair<Tensor, Tensor> swiglu_backward_consuming(Tensor gate, Tensor up, const Tensor& dout);
std::pair<Tensor, Tensor> geglu_backward_consuming(Tensor gate, Tensor up, const Tensor& dout);
// The consuming gradients of swiglu (gelu false) or geglu, plus the forward's output again (the bits
// of swiglu / geglu) for a consumer whose backward needs it (down_proj's adapter): made in the same
// pass, written over dout where nothing else holds dout (hand it over with std::move).
struct GluGrads {
  Tensor dgate, dup, value;
};
GluGrads glu_backward_with_value(Tensor gate, Tensor up, Tensor dout, bool gelu);

// Mixture of experts (kernels/moe.h), on the CPU or CUDA. moe_route: the router's logits f32 (or
// f64 on the CPU) [T, E] -> the top-k experts of each token, i32 [T, K] (largest probability
// first, equal ones: the lower expert first), and their routing weights [T, K] (softmax over the
// experts, renormalised over the k when `renorm`).
struct MoeRoute {
  Tensor ids, weights;
};
MoeRoute moe_route(const Tensor& logits, int64_t k, bool renorm);
Tensor moe_route_backward(const Tensor& logits, const MoeRoute& route, const Tensor& dweights, bool renorm);
// The token-expert assignments grouped by expert, stably (expert e's rows in token order), on the
// ids' device: token_of_row i32 [T K] (row r holds token token_of_row[r]), row_of i32 [T K]
// (assignment t K + j is row row_of[t K + j]), offsets (host) [E + 1]: expert e's rows are
// [offsets[e], offsets[e + 1]); device_offsets, the same as i64 [E + 1] on the ids' device. CUDA
// computes it all on the device and reads back only the offsets (one small copy, a sync); the
// same bits as the CPU.
// rows: i32 [T K] 0, 1, ..., T K - 1 on the ids' device (the identity row_of of a per-row combine;
// made once per size and device).
struct MoeDispatch {
  Tensor token_of_row, row_of;
  std::vector<int64_t> offsets;
  Tensor device_offsets;
  Tensor rows;
};
MoeDispatch moe_dispatch(const Tensor& ids, int64_t experts);
// transformers' load-balancing loss of the router's logits f32 (f64 on the CPU) [N, E] and their
// choices ids [N, K] (kernels/moe.h): a scalar of the logits' dtype on their device (nothing is
// read back). moe_aux_loss_backward gives dlogits for the upstream gradient dloss, a one-element
// tensor on the same device.
Tensor moe_aux_loss(const Tensor& logits, const Tensor& ids);
Tensor moe_aux_loss_backward(const Tensor& logits, const Tensor& ids, const Tensor& dloss);
// y [T, H] = sum over j of weights[t, j] * ys[row_of[t K + j]]; weights in ys's accumulation dtype.
Tensor moe_combine(const Tensor& ys, const Tensor& row_of, const Tensor& weights);
// -> dys [T K, H] and dweights [T, K].
std::pair<Tensor, Tensor> moe_combine_backward(const Tensor& ys, const Tensor& row_of, const Tensor& weights,
                                               const Tensor& dy);

// ids i32 [...], table [vocab, dim] -> [..., dim]. CPU checks ids against vocab.
Tensor embedding(const Tensor& ids, const Tensor& table);
// dtable (acc dtype, [vocab, dim]) += scatter of dout.
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable);

// ---- attention and loss ----
struct AttentionOptions {
  float scale = 0.f;    // 0: 1/sqrt(head_dim)
  float softcap = 0.f;  // 0: off
  int64_t window = 0;   // 0: off; else key j visible to query i iff i - j < window
  Tensor segment_ids;   // optional i32 [batch, seq]: attention stays inside a packed document
};
struct AttentionOut {
  Tensor out;  // [batch, seq, heads, head_dim]
  Tensor lse;  // acc dtype [batch, heads, seq]
};
// q [batch, seq, heads, head_dim], k/v [batch, seq, kv_heads, head_dim]; causal.
AttentionOut attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt);
struct AttentionGrads {
  Tensor dq, dk, dv;
};
// q's rotary embedding as ops::rope takes it (positions [batch * seq] i32, inv_freq f32, mscale).
struct RopeArgs {
  Tensor positions, inv_freq;
  float mscale = 1.f;
};
// With rope_q, dq is the gradient of q before that rotation: rope_backward of attention's dq, rounded
// once where the two ops round twice (the CPU, and CUDA's flash path with the whole head rotating, in
// the pass that finishes dq; a partial rotation on CUDA and its row kernels run rope_backward after).
AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& dout, const Tensor& lse, const AttentionOptions& opt,
                                  const RopeArgs* rope_q = nullptr);

// One new token per sequence against a KV cache: q [batch, heads, head_dim], k/v caches
// [batch, capacity, kv_heads, head_dim] with `length` valid rows -> [batch, heads, head_dim].
Tensor attention_decode(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t length,
                        const AttentionOptions& opt);

struct CrossEntropyOut {
  Tensor loss;  // acc dtype [n]: per-row loss, 0 where ignored
  Tensor lse;   // acc dtype [n]
};
inline constexpr int32_t kIgnoreIndex = -100;
// logits [n, vocab], targets i32 [n]. CPU checks targets against vocab.
CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& targets, float softcap = 0.f,
                              int32_t ignore_index = kIgnoreIndex);
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dloss,
                              float softcap = 0.f, int32_t ignore_index = kIgnoreIndex);

// Fused lm_head + cross-entropy: the mean over targets != ignore_index of the softmax
// cross-entropy of z = softcap(h w^T), computed in row chunks without the [n, vocab] logits; the
// gradients of that mean come out of the same pass. h [n, hidden], w [vocab, hidden] (same
// float dtype), targets i32 [n]. CPU checks targets against vocab; CUDA treats others as ignored.
struct LinearCrossEntropyOptions {
  float softcap = 0.f;
  int32_t ignore_index = kIgnoreIndex;
  int64_t chunk_rows = 0;  // 0: rows whose logits (bf16 or f32) fit in 512 MiB
  bool need_dh = true, need_dw = false;
};
struct LinearCrossEntropyOut {
  Tensor loss;  // acc-dtype scalar []
  Tensor dh;    // like h, when need_dh
  Tensor dw;    // acc dtype [vocab, hidden], when need_dw
};
LinearCrossEntropyOut linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets,
                                           const LinearCrossEntropyOptions& options = {});
// x *= scalar in place, scalar a one-element acc-dtype tensor on x's device (no host read).
void scale_by_scalar_(Tensor& x, const Tensor& scalar);

// ---- optimizer and random ----
// param/exp_avg/exp_avg_sq f32, grad f32 or bf16, all the same numel; writes bf16 copy if given.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWParams& p,
                Tensor* param_bf16 = nullptr);
// adamw_step for each item, the same bits; on one CUDA device with one gradient dtype, beta2, eps and
// gradient scale, in a few launches for all of them (cuda::adamw_step_many), else one by one.
struct AdamWItem {
  Tensor* param;
  const Tensor* grad;
  Tensor* exp_avg;
  Tensor* exp_avg_sq;
  const AdamWParams* p;
  Tensor* param_bf16 = nullptr;
};
void adamw_step_many(const std::vector<AdamWItem>& items);
// Philox counter-based fills: the same numbers on CPU and CUDA for the same (seed, offset).
void uniform_(Tensor& t, uint64_t seed, uint64_t offset, float lo, float hi);
void normal_(Tensor& t, uint64_t seed, uint64_t offset, float mean, float std);
// x * keep / (1 - p) with the keep mask a pure function of (seed, offset, index): calling it again
// on the gradient with the same seed and offset is the backward.
Tensor dropout(const Tensor& x, float p, uint64_t seed, uint64_t offset);

// ---- NF4 4-bit storage (kernels/nf4.h; engine/ops_quant.cpp), bitsandbytes' layout ----
struct Nf4Parts {
  Tensor packed;         // u8 [ceil(n / 2)], element 2j in the high nibble
  Tensor absmax;         // u8 [ceil(n / 64)]: codes of nested_code (double-quantised); or f32 (plain)
  Tensor nested_absmax;  // f32 [ceil(blocks / 256)]; undefined when plain
  Tensor nested_code;    // f32 [256] (bitsandbytes' signed dynamic map); undefined when plain
  float offset = 0.f;    // mean of the f32 absmax, subtracted before the 8-bit quantisation
  bool nested() const { return nested_absmax.defined(); }
};
// Quantises every element of x (f32 or bf16, any shape and strides) on x's device, flattened in
// row-major order; double_quant: compress_statistics=True (QLoRA's default). On CUDA it reads the
// offset back to the host once (a stream synchronisation).
Nf4Parts nf4_quantize(const Tensor& x, bool double_quant = true);
// out (f32 or bf16, contiguous, on the parts' device) receives all out.numel() elements.
void nf4_dequantize_into(const Nf4Parts& q, Tensor& out);
// out [E, ...] (f32 or bf16, contiguous) receives expert e's weight in out[e], each quantised on its own
// (a mixture-of-experts projection's experts): on CUDA one launch per 64 experts where the kernel
// allows (kernels/nf4.h), the same bits as nf4_dequantize_into each.
void nf4_dequantize_experts_into(const std::vector<Nf4Parts>& experts, Tensor& out);
Tensor nf4_dequantize(const Nf4Parts& q, const Shape& shape, DType dtype);
// bitsandbytes' signed 8-bit dynamic map as an f32 [256] tensor on `device` (one per device, shared).
Tensor nf4_nested_code(Device device);

}  // namespace loom::ops
