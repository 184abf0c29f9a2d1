// Differentiable functions on Variables. Each records a Node only when an input requires grad;
// forward and backward of each live side by side in autograd/fn_<family>.cpp.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "autograd/tape.h"
#include "engine/ops.h"

namespace loom::ag {

// Whether anything reads a function's output value. kRootOnly: only gradients start from it, as
// from a checkpointed layer's output while backward recomputes the layer (its value came from the
// first run). The functions that take it record their node as usual but leave the value
// uninitialised (a tensor of its shape and dtype) instead of computing it; their backward never
// reads it.
enum class OutputUse { kRead, kRootOnly };

// ---- elementwise and shape (fn_elementwise.cpp) ----
Variable add(const Variable& a, const Variable& b, OutputUse use = OutputUse::kRead);
Variable sub(const Variable& a, const Variable& b);
Variable mul(const Variable& a, const Variable& b);
Variable scale(const Variable& a, float s);
Variable add_bias(const Variable& a, const Variable& bias);  // a [..., C] + bias [C]
Variable cast(const Variable& a, DType dtype);               // gradient cast back
Variable to_device(const Variable& a, Device device);        // gradient copied back (a --device-map hop)
Variable reshape(const Variable& a, const Shape& shape);
Variable transpose(const Variable& a, int64_t d0, int64_t d1);
Variable narrow(const Variable& a, int64_t dim, int64_t start, int64_t length);
// a [..., sum(sizes)] cut along its last dim into contiguous parts (a fused projection's outputs);
// backward writes the parts' gradients side by side into one tensor (zeros for an unused part).
std::vector<Variable> split(const Variable& a, const std::vector<int64_t>& sizes);
// The parts [..., w_i] (one leading shape) side by side along the last dim: [..., sum of w_i].
Variable cat_last(const std::vector<Variable>& parts);
Variable sum(const Variable& a);  // f32 scalar
// y = f(x_1..x_n) of scalar inputs, evaluated on the host in f64; f also fills dy/dx_i, which
// backward scales by dy. For small functions of a few per-sequence values (preference losses); the
// inputs are read back (a device sync). y is an f32 scalar on the first input's device.
using HostScalarFn = std::function<double(const std::vector<double>& x, std::vector<double>& dy_dx)>;
Variable host_scalar(const std::vector<Variable>& inputs, const HostScalarFn& f);
Variable softcap(const Variable& a, float cap);  // cap * tanh(a / cap)
// Inverted dropout with a regenerated (never stored) mask; p = 0 returns a unchanged.
Variable dropout(const Variable& a, float p, uint64_t seed, uint64_t offset);

// ---- matrix products (fn_linalg.cpp) ----
// a [..., m, k] x b [k, n] (2-D, shared) or batched like a; transposes as in ops::matmul.
Variable matmul(const Variable& a, const Variable& b, bool trans_a = false, bool trans_b = false,
                OutputUse use = OutputUse::kRead);
// x [..., in] x w [out, in]^T (+ bias [out]).
Variable linear(const Variable& x, const Variable& w, const Variable* bias = nullptr, OutputUse use = OutputUse::kRead);

// ---- LoRA (fn_lora.cpp) ----
struct LoraArgs {
  float scale = 1.f;    // alpha / r (or alpha / sqrt(r) with rsLoRA)
  float dropout = 0.f;  // applied to the adapter's input only, regenerated in backward (never stored)
  uint64_t seed = 0, offset = 0;
  // Columns after each row of x that the product may write (a norm's output with spare columns,
  // ops::rms_norm): in bf16 without dropout, with x_spare >= 3 r (+ 1 with a bias), the adapter's
  // input goes there and y = [x, t, 1] [W, B, bias]^T is one GEMM (see fn_lora.cpp). The callers of x's other
  // products are ordered after this one's on the stream, so they may reuse the same columns.
  int64_t x_spare = 0;
  // The same for the weight: columns after W's rows that the product may write (Linear::weight_spare,
  // a frozen bf16 weight loaded wide or widened when its adapter was attached). The one GEMM runs only when
  // both x and W have the room: B's columns (and the bias) are written beside W, W is never copied.
  int64_t w_spare = 0;
};
// x [..., in] W[out, in]^T + scale * (dropout(x) A[r, in]^T) B[out, r]^T: every product a GEMM in
// x's dtype with f32 accumulation; A and B (f32 masters) are used in that dtype and their gradients
// come back in their own. W may be frozen (LoRA) or trained. The bias [out] (optional) is added to
// the base product before the adapter's, as PEFT adds the adapter to the base layer's output.
// A frozen weight that backward materialises again instead of keeping it alive (a dequantised
// NF4 weight): empty = keep the forward's tensor.
using WeightFn = std::function<Tensor()>;
// An input that backward computes again instead of keeping it alive (the SwiGLU output, from the
// gate and up the activation keeps anyway): empty = keep x.
using InputFn = std::function<Tensor()>;
// residual (the output's shape and dtype): residual + that, read by the GEMM that writes the output
// first (its C, apart from D) where there is one (bf16 with a contiguous residual: the one GEMM, or the
// adapter's product without a bias), else added after; its gradient is the output's.
Variable lora_linear(const Variable& x, const Variable& w, const Variable& a, const Variable& b, const LoraArgs& lora,
                     const Variable* bias = nullptr, const WeightFn& rematerialize = {},
                     const InputFn& recompute_x = {}, OutputUse use = OutputUse::kRead,
                     const Variable* residual = nullptr);
// lora_linear(act(gate) * up, ...) for a gated MLP's down projection (act: silu, or gelu_tanh with
// gelu), with a frozen weight and no adapter dropout: the same values and gradients, but act(gate) * up
// is not kept or computed apart for the adapter's dA: the activation's backward makes it again in its
// own pass over gate, up and their output gradient, and finishes dA there. residual as lora_linear's
// (the MLP's residual add without a pass of its own over [tokens, out]).
Variable glu_lora_linear(const Variable& gate, const Variable& up, bool gelu, const Variable& w, const Variable& a,
                         const Variable& b, const LoraArgs& lora, const Variable* bias = nullptr,
                         const WeightFn& rematerialize = {}, OutputUse use = OutputUse::kRead,
                         const Variable* residual = nullptr);
// One of several products that read the same x (q, k and v; gate and up), for lora_linears.
struct LoraProduct {
  Tensor weight;         // the frozen base weight [out, in] (a view of its wide storage: LoraArgs::w_spare)
  WeightFn make_weight;  // or, when weight is undefined, how to make it (an NF4 weight dequantised):
                         // made for its product in forward and again in backward, never held between
  const Variable* a = nullptr;     // lora_A [r, in]
  const Variable* b = nullptr;     // lora_B [out, r]
  const Variable* bias = nullptr;  // [out] or null
  LoraArgs lora;                   // scale, x_spare and w_spare (no dropout here)
};
// lora_linear of each product over one x in bf16, with what the products share done once: x's
// adapter inputs t = x A^T of every adapter are one GEMM (x read once, not once per product), and
// in backward dA of every adapter is one GEMM over x, and their scale * dt A terms of dx one GEMM
// before the base products add dy W onto it. The same values as lora_linear of each, up to the
// order of f32 sums. Needs x in bf16, frozen weights, no adapter dropout and
// one scale for all (ag callers: models/layers.cpp's forward_shared_input falls back to lora_linear
// otherwise).
std::vector<Variable> lora_linears(const Variable& x, const std::vector<LoraProduct>& products);
// x W^T (+ bias) with W frozen (no gradient) and re-materialised by `rematerialize` for backward.
Variable frozen_linear(const Variable& x, const Variable& w, const WeightFn& rematerialize, const Variable* bias = nullptr,
                       OutputUse use = OutputUse::kRead);

// ---- normalization, position, activation, lookup (fn_nn.cpp) ----
// spare: the output's rows carry that many columns after them (ops::rms_norm; LoraArgs::x_spare).
Variable rms_norm(const Variable& x, const Variable& w, float eps, bool add_one = false, int64_t spare = 0);
// The residual add and the norm after it as one node: {h = x + r, rms_norm(h)} (ops::add_rms_norm),
// with backward's two gradients of h (the residual stream's and the norm's) summed in the norm's
// backward pass instead of a separate addition. Same values as add then rms_norm.
std::pair<Variable, Variable> add_rms_norm(const Variable& x, const Variable& r, const Variable& w, float eps,
                                           bool add_one = false, int64_t spare = 0);
// x [batch, seq, heads, head_dim]; positions i32 [batch*seq]; inv_freq f32 [rotary_dim/2] (ops::rope:
// partial rotation, cos/sin scaled by mscale).
Variable rope(const Variable& x, const Tensor& positions, const Tensor& inv_freq, float mscale = 1.f);
// rope of q and of k as one node: one launch each way on CUDA (ops::rope_pair), the same values.
std::pair<Variable, Variable> rope_qk(const Variable& q, const Variable& k, const Tensor& positions,
                                      const Tensor& inv_freq, float mscale = 1.f);
Variable swiglu(const Variable& gate, const Variable& up);
Variable geglu(const Variable& gate, const Variable& up);
Variable embedding(const Tensor& ids, const Variable& table);

// Mixture of experts (engine/ops.h moe_*). moe_route: the top-k experts of each token (constant) and
// their routing weights, differentiable in the router's logits.
struct MoeRouting {
  ops::MoeRoute route;
  Variable weights;  // route.weights, on the tape
};
MoeRouting moe_route(const Variable& logits, int64_t k, bool renorm);
// transformers' load-balancing loss (engine/ops.h moe_aux_loss) of the router's logits of every
// MoE layer, concatenated [N, E], with the experts they chose [N, K]: a scalar of the logits' dtype
// (f32; f64 in gradient checks) on their device, computed and differentiated without a read-back.
Variable moe_aux_loss(const Variable& logits, const Tensor& ids);
// x [T, H] -> xs [T K, H]: row r is token d.token_of_row[r]'s (its rows grouped by expert); backward
// sums each token's K rows back (ops::moe_combine with unit weights: deterministic, no atomics).
Variable moe_gather(const Variable& x, const ops::MoeDispatch& d, int64_t k);
// y [T, H] = sum over j of weights[t, j] * ys[row_of[t K + j]]: gradients to ys and weights (which
// keeps ys for the weights' gradient, or makes it again with recompute_ys). With row_of = d.rows and
// weights [T K, 1]: each row scaled.
Variable moe_combine(const Variable& ys, const Variable& weights, const Tensor& row_of, const InputFn& recompute_ys = {});
// y [T, H] = the sum of each token's K rows of ys [T K, H] (unit weights, as moe_gather's
// backward); backward hands each row its token's gradient (a gather), so ys is not kept.
Variable moe_sum(const Variable& ys, const ops::MoeDispatch& d, int64_t k, OutputUse use = OutputUse::kRead);
// weights [T, K] -> [T K, 1] in row order: row d.row_of[t K + j] gets weights[t, j].
Variable moe_row_weights(const Variable& weights, const ops::MoeDispatch& d);

// ---- grouped expert products (fn_grouped.cpp) ----
// Rows [offsets[e], offsets[e + 1]) of xs [N, in] times expert e's w[e] [out, in] transposed, for every
// expert: [N, out] in xs's dtype, through ops::grouped_matmul_into (one grouped GEMM on CUDA). w has
// xs's dtype, or is an f32 master used in bf16 (cast for the products; its gradient comes back in f32).
// With use kRootOnly the product is recorded and not computed (its backward needs nothing of it);
// recompute_x (as lora_linear's) makes xs again in backward where it would otherwise be kept.
Variable grouped_linear(const Variable& xs, const Variable& w, const std::vector<int64_t>& offsets,
                        OutputUse use = OutputUse::kRead, const InputFn& recompute_x = {});
// A frozen expert weight [E, out, in] made when a product needs it instead of kept (QLoRA experts,
// dequantised from NF4): make(first, count, dtype) gives experts [first, first + count) as
// [count, out, in] in dtype, which the product uses before it calls make again. The products with it
// (forward, and the input gradient in backward) run `chunk` experts at a time, skipping chunks without
// rows, so no more than [chunk, out, in] of it exists at once.
struct ExpertWeightFn {
  Shape shape;        // [E, out, in]
  int64_t chunk = 0;  // experts per make(); 0 (or E and more): all at once
  std::function<Tensor(int64_t first, int64_t count, DType dtype)> make;
};
Variable grouped_linear(const Variable& xs, const ExpertWeightFn& w, const std::vector<int64_t>& offsets,
                        OutputUse use = OutputUse::kRead, const InputFn& recompute_x = {});
// Per-expert LoRA: xs w[e]^T + scale * (xs a[e]^T) b[e]^T for expert e's rows; w [E, out, in] (frozen
// as a rule, bf16 or f32 as in grouped_linear), a [E, r, in] and b [E, out, r] (f32 masters, used in
// xs's dtype; their gradients come back in their own). One node: five grouped GEMMs backward at most.
// With use kRootOnly only the adapter's xs a[e]^T (backward's) is computed, not the output.
Variable grouped_linear_lora(const Variable& xs, const Variable& w, const Variable& a, const Variable& b, float scale,
                             const std::vector<int64_t>& offsets, OutputUse use = OutputUse::kRead,
                             const InputFn& recompute_x = {});
Variable grouped_linear_lora(const Variable& xs, const ExpertWeightFn& w, const Variable& a, const Variable& b,
                             float scale, const std::vector<int64_t>& offsets, OutputUse use = OutputUse::kRead,
                             const InputFn& recompute_x = {});

// ---- attention and loss (fn_attention.cpp) ----
Variable attention(const Variable& q, const Variable& k, const Variable& v, const ops::AttentionOptions& opt);
// attention(rope_qk(q, k), v) as one node: q's rope backward rides in the pass that finishes attention's
// dq on CUDA (ops::attention_backward's rope_q), k's is rope's own; the same forward values.
Variable rope_attention(const Variable& q, const Variable& k, const Variable& v, const ops::RopeArgs& rope,
                        const ops::AttentionOptions& opt);
// Mean softmax cross-entropy over targets != ignore_index (as torch's reduction='mean'); an
// all-ignored batch gives 0. logits [n, vocab]; result is an acc-dtype scalar.
Variable cross_entropy(const Variable& logits, const Tensor& targets, float softcap = 0.f,
                       int32_t ignore_index = ops::kIgnoreIndex);

// ---- fused loss (fn_loss.cpp) ----
// cross_entropy(linear(h, w), targets, softcap, ignore_index) without the [n, vocab] logits:
// h [n, hidden], w [vocab, hidden] (the lm_head weight), targets i32 [n]; an acc-dtype scalar.
// The gradients are computed during the forward (only for inputs that require grad) and held
// until backward; chunk_rows 0 picks rows whose logits (bf16 or f32) fit in 512 MiB.
Variable linear_cross_entropy(const Variable& h, const Variable& w, const Tensor& targets, float softcap = 0.f,
                              int32_t ignore_index = ops::kIgnoreIndex, int64_t chunk_rows = 0);

// ---- recompute checkpointing (checkpoint.cpp) ----
using CheckpointFn = std::function<std::vector<Variable>(const std::vector<Variable>&)>;
struct CheckpointOptions {
  // Move the saved inputs to pinned host memory (on a side stream, overlapping fn's compute) and
  // back before recompute, one checkpoint ahead of need.
  bool offload = false;
  // fn uses trainable Variables it captures (a layer's LoRA weights): record whenever grad mode is
  // on, also when no input requires grad.
  bool captures_trainable = false;
  // Send each attention's output and log-sum-exp from fn's first run to its rerun through pinned
  // host memory (autograd/stash.h), so that the rerun takes them instead of running the attention
  // forward again: the pinned bytes the checkpoints sharing it may still fill (null: none). For
  // offload, whose host copies it joins.
  std::shared_ptr<std::atomic<int64_t>> stash_room = nullptr;
};
// Attention outputs this thread's reruns took from a stash so far (tests count them).
int64_t stash_hits();
// Runs fn without recording; saves only its inputs; in backward re-runs fn with recording and
// back-propagates through it. fn must be deterministic (seeded RNG) and may use Variables it
// captures (weights): their gradients accumulate as usual.
std::vector<Variable> checkpoint(const CheckpointFn& fn, const std::vector<Variable>& inputs,
                                 const CheckpointOptions& options = {});

}  // namespace loom::ag
