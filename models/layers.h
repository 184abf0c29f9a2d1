// The building blocks of every family, named as in Hugging Face checkpoints: Linear (with an
// optional LoRA adapter), RmsNorm, Attention (q/k/v/o projections, optional q/k norms), Mlp and
// DecoderLayer. Each module knows its Hugging Face name ("model.layers.0.self_attn.q_proj").
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "models/dequant_scratch.h"
#include "models/nf4_weight.h"

namespace loom {

// LoRA on a Linear: y += scale * dropout(x) A^T B^T, computed in f32 as PEFT does.
struct LoraAdapter {
  ag::Variable A;  // f32 [r, in]  (PEFT lora_A.weight)
  ag::Variable B;  // f32 [out, r] (PEFT lora_B.weight)
  float scale = 1.f;
  float dropout = 0.f;
  uint64_t dropout_seed = 0;  // the trainer advances dropout_offset every step
  uint64_t dropout_offset = 0;
  bool training = false;  // dropout applies only while the trainer trains (never in forward/generate)
  bool enabled = true;    // off: the Linear is its base weight alone (a preference objective's reference)
};

// A linear layer whose frozen base weight is dense or 4-bit NF4 (QLoRA), plus an optional LoRA
// adapter. An NF4 weight is dequantised for each product and dropped after it (backward
// dequantises again): the model is never held in full precision.
struct Linear {
  std::string name;
  ag::Variable weight;  // [out, in]; undefined when the weight is NF4
  std::shared_ptr<const Nf4Weight> nf4;  // the frozen 4-bit weight, or null
  ag::Variable bias;    // [out] or undefined
  std::unique_ptr<LoraAdapter> lora;
  // Columns after each row of the dense weight's storage (weight is a view of its first in_features
  // columns) where the one-GEMM LoRA product writes its adapter's B beside W (ag::LoraArgs::w_spare),
  // set by widen; 0 for a contiguous weight.
  int64_t weight_spare = 0;

  bool quantized() const { return nf4 != nullptr; }
  int64_t in_features() const { return nf4 ? nf4->shape[1] : weight.size(1); }
  int64_t out_features() const { return nf4 ? nf4->shape[0] : weight.size(0); }
  // The base weight [out, in] as a dense tensor of dtype (dequantised when NF4).
  Tensor dense_weight(DType dtype) const;
  // recompute_x: how backward gets x again instead of keeping it (used by the LoRA path only).
  // use: kRootOnly skips the product (and an NF4 weight's dequantisation) when nothing reads it.
  // x_spare: columns after x's rows the adapter's product may write (ag::LoraArgs::x_spare).
  // residual: residual + the output (the adapter's product adds it in its GEMM where it can).
  ag::Variable forward(const ag::Variable& x, const ag::InputFn& recompute_x = {},
                       ag::OutputUse use = ag::OutputUse::kRead, int64_t x_spare = 0,
                       const ag::Variable* residual = nullptr) const;
  // The spare columns this product's adapter takes after the rows of an input of dtype (3 r, + 1
  // with a bias, when it computes y = [x, t, 1] [W, B, bias]^T as one GEMM: bf16, an enabled adapter,
  // no dropout in effect), or 0.
  int64_t adapter_spare(DType dtype) const;
  // Gives a frozen dense bf16 weight with an adapter (no dropout) the spare columns adapter_spare
  // asks for, unless it has them already (loaded wide: LoadOptions::adapter_room). A no-op otherwise
  // (NF4, trained or f32 weights).
  void widen_for_adapter();
  // Moves a frozen dense bf16 weight into a [out, in + padded_spare(in, spare)] buffer and makes it
  // the view of its first in columns (weight_spare = the padded spare); a no-op for
  // other weights or when it has that room already.
  void widen(int64_t spare);
  // forward(act(gate) * up) for a gated MLP's down projection (act silu, or gelu_tanh with gelu):
  // with an adapter on a frozen weight and no dropout in effect, ag::glu_lora_linear (the activation's
  // backward makes act(gate) * up again for the adapter's dA in its own pass); else the two apart,
  // act(gate) * up computed again in backward where the adapter needs it.
  // With residual: residual + that (added by the product's GEMM on the fused path).
  ag::Variable forward_glu(const ag::Variable& gate, const ag::Variable& up, bool gelu,
                           ag::OutputUse use = ag::OutputUse::kRead, const ag::Variable* residual = nullptr) const;
};

// The products of Linears that read one x (q, k and v; gate and up): ag::lora_linears (x's adapter
// passes shared) where every one has an enabled adapter with no dropout in effect on a frozen weight,
// x is bf16 and the adapters share their scale; else each Linear::forward on its own. x_spare as
// for Linear::forward.
std::vector<ag::Variable> forward_shared_input(const std::vector<const Linear*>& ls, const ag::Variable& x,
                                               int64_t x_spare = 0);

struct RmsNorm {
  std::string name;
  ag::Variable weight;  // [dim]
  float eps = 1e-6f;
  bool add_one = false;  // Gemma: x * (1 + w)
  // spare: columns left after each output row for the adapters of the products that read it
  // (input_spare below; ops::rms_norm).
  ag::Variable forward(const ag::Variable& x, int64_t spare = 0) const {
    return ag::rms_norm(x, weight, eps, add_one, spare);
  }
  // {h = x + r, forward(h)}: the residual add before the norm, fused with it (ag::add_rms_norm).
  std::pair<ag::Variable, ag::Variable> forward_residual(const ag::Variable& x, const ag::Variable& r,
                                                         int64_t spare = 0) const {
    return ag::add_rms_norm(x, r, weight, eps, add_one, spare);
  }
};

// A Linear that a family may leave out has an empty name (not built, not listed, never called).
inline bool present(const Linear& l) { return !l.name.empty(); }

// The spare columns a norm's output [.., in] of dtype should carry for the products that read it:
// the largest of their adapter_spare when every one takes the one-GEMM path (its x_spare then goes
// to each product in turn), else 0 (a product without it would copy the strided input).
int64_t input_spare(const std::vector<const Linear*>& readers, DType dtype);
// At least `spare` columns after rows of `cols`, rounded up so that the rows of the wider buffer
// start 128 bytes apart in bf16 (16 when cols is not a multiple of 8).
int64_t padded_spare(int64_t cols, int64_t spare);

struct Attention {
  Linear q_proj, k_proj, v_proj, o_proj;
  // Phi-3: q, k and v as one fused Linear (rows q, then k, then v) in place of the three, as its
  // checkpoints, llama.cpp and PEFT keep it (a LoRA adapter on qkv_proj shares its A across the three).
  Linear qkv_proj;
  std::optional<RmsNorm> q_norm, k_norm;  // Qwen3: per-head RMSNorm of q and k before RoPE
  // The projections present, in checkpoint order.
  std::vector<Linear*> linears();
  // input_spare of the projections that read the layer's normed input (q, k, v or qkv).
  int64_t input_spare(DType dtype) const;
  // Those projections, present ones.
  std::vector<Linear*> input_readers();
};

struct Mlp {
  Linear gate_proj, up_proj, down_proj;
  Linear gate_up_proj;  // Phi-3: gate and up fused (rows gate, then up) in place of the two
  bool gelu = false;  // gelu_pytorch_tanh (Gemma) instead of SiLU
  // use: whether anything reads the output (down_proj's product is skipped when not). x_spare:
  // the columns after x's rows (input_spare) for gate's and up's adapters.
  // residual: residual + the output (down_proj's forward_glu).
  ag::Variable forward(const ag::Variable& x, ag::OutputUse use = ag::OutputUse::kRead, int64_t x_spare = 0,
                       const ag::Variable* residual = nullptr) const;
  std::vector<Linear*> linears();  // present ones, in checkpoint order
  // input_spare of gate and up (or gate_up).
  int64_t input_spare(DType dtype) const;
  std::vector<Linear*> input_readers();  // gate and up (or gate_up), present ones
};

// One projection of every expert of a mixture-of-experts layer, stacked as transformers 5.x holds
// it: weight [E, out, in], or (QLoRA) one NF4 weight per expert, each quantised as bitsandbytes
// quantises a Linear weight of [out, in]. LoRA: one A [r, in] and B [out, r] per expert, stacked
// A [E, r, in] and B [E, out, r] (PEFT's ParamWrapper stores them as [r E, in] and [out, r E]).
// The most bytes of dequantised NF4 experts a product holds at once: a Qwen3-30B-A3B layer's gate_up
// experts are 805 MB in bf16 (4 chunks of 32 experts, 201 MB each), its down experts 403 MB (2 of 64);
// Mixtral-8x7B's are 235 MB an expert (1 at a time). Whole, they were the 1.2 GB that kept Loom's
// QLoRA above Unsloth's memory on the H200 (session 34).
constexpr int64_t kDequantChunkBytes = int64_t{256} << 20;

struct ExpertLinear {
  std::string name;  // "model.layers.0.mlp.experts.gate_up_proj" (transformers 5.x's parameter name)
  ag::Variable weight;  // [E, out, in]; undefined when NF4
  std::vector<std::shared_ptr<const Nf4Weight>> nf4;  // per expert, or empty
  std::shared_ptr<DequantScratch> scratch;             // where NF4 experts dequantise (null: a new tensor)
  std::unique_ptr<LoraAdapter> lora;
  int64_t experts = 0, out = 0, in = 0;
  // NF4 experts a product dequantises at once (0: as many as fit kDequantChunkBytes, balanced).
  int64_t dequant_chunk = 0;

  bool quantized() const { return !nf4.empty(); }
  // Experts [first, first + count) ([first, E) when count < 0) dense in dtype: [count, out, in]
  // (dequantised when NF4).
  Tensor dense_weight(DType dtype, int64_t first = 0, int64_t count = -1) const;
  // How many NF4 experts a product dequantises at once.
  int64_t chunk_experts(DType dtype) const;
  // w [count, out, in] <- NF4 experts [first, first + count) dequantised.
  void dequantize_into(Tensor& w, int64_t first) const;
  // Whether backward needs the input (for the adapter's or the weight's gradient).
  bool keeps_input() const;
  // Rows [offsets[e], offsets[e + 1]) of xs [N, in] through expert e: [N, out]; use kRootOnly: not
  // computed; recompute_x: xs made again in backward instead of kept (ag::grouped_linear's).
  ag::Variable forward(const ag::Variable& xs, const std::vector<int64_t>& offsets,
                       ag::OutputUse use = ag::OutputUse::kRead, const ag::InputFn& recompute_x = {}) const;
};

// What a MoE layer's router chose, for the load-balancing loss: its f32 logits [tokens, E] (on the
// tape) and the experts chosen [tokens, k].
struct RouterOutput {
  ag::Variable logits;
  Tensor ids;
};

// A mixture-of-experts MLP (Mixtral, Qwen3-MoE): the router `gate` [E, hidden] (its logits computed
// in the model dtype, then softmax in f32, top k, renormalised when the config says), and the
// experts' SwiGLU: gate_up [E, 2 I, hidden] (each expert's gate rows, then its up rows) and down
// [E, hidden, I]. Each token's rows go to its experts grouped by expert, and come back weighted by
// the routing weights. The weights scale each row's SwiGLU output, before down, rather than down's
// output as transformers does: the product is linear, so y is the same (to rounding), and then
// backward needs nothing of down's output [T K, hidden]: it is not kept, and a checkpoint's rerun
// (use kRootOnly: nothing reads the layer's output) skips down's product, its NF4 experts included.
// What backward reads beside gate and up is made again rather than kept: the gathered rows [T K,
// hidden] (gate_up's adapter gradient) from the tokens' [T, hidden], the SwiGLU rows (the weights'
// gradient) and their weighted copy (down's adapter gradient) from gate and up.
struct MoeMlp {
  std::string name;      // "model.layers.0.mlp"
  ag::Variable router;   // [E, hidden] ("<name>.gate.weight")
  ExpertLinear gate_up, down;
  int64_t top_k = 2;
  bool renormalize = true;
  // Qwen3-MoE rounds the routing weights to the model dtype before they scale the experts' outputs.
  bool round_weights = false;
  // x [tokens, hidden] -> [tokens, hidden]; `router` (when not null) gets what the router chose.
  ag::Variable forward(const ag::Variable& x, RouterOutput* router = nullptr,
                       ag::OutputUse use = ag::OutputUse::kRead) const;
  std::vector<ExpertLinear*> experts() { return {&gate_up, &down}; }
};

struct DecoderLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  std::optional<RmsNorm> pre_feedforward_layernorm, post_feedforward_layernorm;  // Gemma 2
  Attention self_attn;
  Mlp mlp;                     // dense layers
  std::optional<MoeMlp> moe;   // mixture-of-experts layers, in place of mlp
  int64_t window = 0;  // sliding-window size for this layer, 0 = full causal
};

}  // namespace loom
