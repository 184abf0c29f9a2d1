// CausalLM: a decoder-only language model of any supported family (models/families/), loaded from a
// Hugging Face folder by tensor name, with the same forward pass and loss as transformers.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/precision.h"
#include "models/config.h"
#include "models/layers.h"
#include "models/placement.h"

namespace loom {
class Checkpoint;
class LayerStreamer;
namespace detail {
struct LayerContext;
}

// How decoder layers keep what backward needs (loom train --checkpointing):
//   kNone: every activation stays on the GPU (fastest, most memory);
//   kRecompute: each layer keeps only its input and recomputes its inside during backward;
//   kOffload: as kRecompute, with the inputs in pinned host memory (copied down on a side stream
//   while the layer computes, and back one layer ahead of need).
enum class Checkpointing { kNone, kRecompute, kOffload };
absl::StatusOr<Checkpointing> parse_checkpointing(const std::string& text);
const char* checkpointing_name(Checkpointing c);

struct LoadOptions {
  DType dtype = DType::bf16;  // weights and activations (f32 or bf16)
  Device device = Device::cpu();
  // QLoRA: quantise the decoder Linear weights to NF4 as they load (one weight at a time, on the
  // device). A checkpoint that is already bitsandbytes 4-bit loads as it is stored, either way.
  bool quantize_4bit = false;
  // Weights holding NaN or infinity are refused (an error naming the tensor and the first bad
  // element) unless this is set: for inspecting a damaged model on purpose (--allow-nonfinite).
  bool allow_nonfinite = false;
  // Where each part lives and runs (--device-map); unset: everything on `device`. Layers it streams
  // load on their device and then move to host memory, one at a time.
  std::optional<Placement> placement = std::nullopt;
  // Spare columns to give, as they load, the dense bf16 weights of the projections that read a
  // norm's output (norm_readers()), for the one-GEMM product of a LoRA adapter of rank r to come
  // (3 r + 1; Linear::widen_for_adapter). Widened at load, each contiguous copy is freed before the
  // next weight loads and the pool reuses it; widened later, at attach, the freed copies stay holes
  // in the pool (half a GiB more reserved on the 1B shape). 0: none.
  int64_t adapter_room = 0;
};

// Positions {start, length} of a forward's flattened [batch*seq] tokens.
struct TokenSpan {
  int64_t start = 0, length = 0;
};

struct ForwardOptions {
  Tensor positions;    // optional i32 [batch*seq]; default 0..seq-1 in every row
  Tensor segment_ids;  // optional i32 [batch, seq]: attention stays inside a packed document
  // The largest of `positions` when the caller knows it (-1: read from them when needed). LongRoPE
  // picks its short or long factors by it, as transformers does by max(position_ids) + 1.
  int64_t max_position = -1;
  // Mixture-of-experts models: the load-balancing loss (transformers' load_balancing_loss_func over
  // every MoE layer's router) joins loss()'s result times this coefficient when it is above 0;
  // `aux_loss`, when not null, receives it from loss(), forward() or sequence_logps() (unscaled, f32
  // scalar on the tape; sequence_logps never adds it to anything).
  double router_aux_loss_coef = 0;
  ag::Variable* aux_loss = nullptr;
  // The tokens whose routing the load-balancing loss averages over (transformers' attention_mask, as
  // spans: padding left out); empty: every token.
  std::vector<TokenSpan> aux_spans;
};

class CausalLM {
 public:
  ~CausalLM();
  // Reads config.json and the (single or sharded) safetensors, or a llama.cpp .gguf file (mapped by
  // models/gguf_model.h). A missing tensor, a shape that
  // disagrees with the config, or a tensor the model does not use is an error naming it.
  static absl::StatusOr<std::unique_ptr<CausalLM>> load(const std::string& model_dir, const LoadOptions& options);
  // A freshly initialised model (N(0, 0.02) weights, unit norms) from config_dir/config.json.
  static absl::StatusOr<std::unique_ptr<CausalLM>> init_random(const std::string& config_dir, const LoadOptions& options,
                                                               uint64_t seed);
  // The same with the config given instead of read from config.json (its family may be a spec
  // outside the registry: tests build one to exercise the seam). load() reads model_dir's safetensors.
  static absl::StatusOr<std::unique_ptr<CausalLM>> load(const ModelConfig& config, const std::string& model_dir,
                                                        const LoadOptions& options);
  static absl::StatusOr<std::unique_ptr<CausalLM>> init_random(const ModelConfig& config, const LoadOptions& options,
                                                               uint64_t seed);

  const ModelConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }
  // Which dtype each kind of tensor uses (from the load dtype): LoRA, the trainer and the logits read it.
  Precision precision() const { return Precision::for_dtype(dtype_); }
  // Where the embedding runs: input ids go there. A model placed over devices (LoadOptions::placement)
  // runs each part where placement() says; the logits and the loss come from the head's device.
  Device device() const { return device_; }
  const Placement& placement() const { return placement_; }
  Device output_device() const { return placement_.head; }
  // The device a module runs on, by its Hugging Face name (LoRA adapters are created there).
  Device device_of(const std::string& module) const { return placement_.device_of(module); }
  // The layers streamed from host memory (null when none is).
  const LayerStreamer* streamer() const { return streamer_.get(); }
  const std::string& source_dir() const { return source_dir_; }
  // What loading left out on purpose, one line each (a multimodal checkpoint's vision tower), for
  // the caller to show; empty for most models.
  const std::vector<std::string>& load_notes() const { return load_notes_; }

  // input_ids i32 [batch, seq] (on any device; moved to the model's) -> logits f32 [batch, seq, vocab].
  ag::Variable forward(const Tensor& input_ids, const ForwardOptions& options = {}) const;
  // causal_lm_loss(forward(input_ids, options), labels) without the [tokens, vocab] logits: the
  // final norm's output goes through ag::linear_cross_entropy with lm_head's weight and
  // config().final_logit_softcapping (the unfused path when lm_head has a LoRA adapter or a bias).
  // labels i32 [batch, seq] (read on the host): position s is scored against labels[s + 1].
  ag::Variable loss(const Tensor& input_ids, const Tensor& labels, const ForwardOptions& options = {}) const;
  // The same with the targets already shifted (shift_labels): i32 [batch*seq] on any device. The
  // trainer uploads them with the batch, so nothing is read back or copied from pageable memory.
  ag::Variable loss_from_targets(const Tensor& input_ids, const Tensor& targets, const ForwardOptions& options = {}) const;

  // Per-sequence sums of the targets' log-probabilities, sum over t of log p(targets[t] | the row up
  // to t) with -100 skipped: one f32 scalar per span of positions {start, length} of the flattened
  // [batch*seq] (by default one span per row), on the model's device (a span without targets is a
  // constant 0), each from the fused lm_head + cross-entropy over the span's positions, so the
  // [tokens, vocab] logits never exist. targets: shifted labels, i32 [batch*seq] on the host. Spans
  // of rows that pack several sequences need options.segment_ids. The sequence log-probabilities of
  // preference objectives (DPO's pi and ref).
  using Span = TokenSpan;
  std::vector<ag::Variable> sequence_logps(const Tensor& input_ids, const Tensor& targets,
                                           const ForwardOptions& options = {}, std::vector<Span> spans = {}) const;

  // Generation with a KV cache (batch 1, no gradients): runs input_ids [1, n] at positions
  // start..start+n-1, appending their keys and values to the cache; returns logits f32 [1, 1, vocab]
  // for the last position ([1, n, vocab] with all_positions).
  struct KvCache {
    std::vector<Tensor> k, v;  // per layer [1, capacity, kv_heads, head_dim]
    int64_t length = 0;
  };
  KvCache make_cache(int64_t capacity) const;
  ag::Variable forward_cached(const Tensor& input_ids, KvCache& cache, bool all_positions = false) const;

  // Every Linear in model order (LoRA injection walks these).
  std::vector<Linear*> linears();
  std::vector<const Linear*> linears() const;
  // The Linears whose input is a norm's output, which may carry spare columns for their adapters
  // (q/k/v or qkv, and a dense MLP's gate/up or gate_up): the ones Linear::widen_for_adapter serves.
  std::vector<Linear*> norm_readers();
  // Every expert projection of the mixture-of-experts layers, in model order (gate_up, then down).
  std::vector<ExpertLinear*> expert_linears();
  std::vector<const ExpertLinear*> expert_linears() const;
  // Every weight by its Hugging Face name; a tied lm_head appears only as the embedding, and 4-bit
  // (NF4) Linear weights not at all.
  std::vector<std::pair<std::string, const ag::Variable*>> named_weights() const;
  std::vector<std::pair<std::string, ag::Variable*>> named_weights();
  // Makes every base weight a leaf that collects gradients (full fine-tuning), or freezes them.
  void set_weights_trainable(bool trainable);
  // Applies to training forwards (grad mode on, no KV cache); the results are the same in every mode.
  void set_checkpointing(Checkpointing mode) { checkpointing_ = mode; }
  Checkpointing checkpointing() const { return checkpointing_; }

 private:
  CausalLM();
  static absl::StatusOr<std::unique_ptr<CausalLM>> build(const ModelConfig& config, const std::string& source_dir,
                                                         const LoadOptions& options, const Checkpoint* ck,
                                                         uint64_t seed);
  detail::LayerContext context_for(const Tensor& input_ids, const ForwardOptions& options) const;
  // Embedding, decoder layers and the final norm: [batch, seq (or 1 with last_only), hidden].
  ag::Variable hidden_states(const Tensor& input_ids, detail::LayerContext& ctx, KvCache* cache,
                             bool last_only = false) const;
  // lm_head, the final soft-cap, and the cast to f32 logits.
  ag::Variable head(const ag::Variable& h) const;
  ag::Variable run(const Tensor& input_ids, detail::LayerContext& ctx, KvCache* cache, bool last_only = false) const;

  ModelConfig config_;
  DType dtype_ = DType::bf16;
  Device device_;
  std::string source_dir_;
  std::vector<std::string> load_notes_;
  ag::Variable embed_tokens_;  // model.embed_tokens.weight [vocab, hidden]
  std::vector<DecoderLayer> layers_;
  RmsNorm norm_;
  Linear lm_head_;  // weight is embed_tokens_ when tied
  // The RoPE of one layer type: its table (LongRoPE: the short factors' and the long factors') and
  // the scaling of cos and sin.
  struct RopeTables {
    Tensor inv_freq, inv_freq_long;
    const RopeParams* params = nullptr;
    void pick(int64_t max_position, detail::LayerContext& ctx) const;
  };
  RopeTables rope_full_;     // full-attention layers
  RopeTables rope_sliding_;  // sliding-window layers (the same tables unless the family gives them their own)
  // The same tables on the other devices the layers run on (device name -> {full, sliding}).
  std::map<std::string, std::pair<RopeTables, RopeTables>> rope_elsewhere_;
  Placement placement_;
  std::unique_ptr<LayerStreamer> streamer_;
  // Moves ctx's per-forward tensors (positions, segment ids) to `d` and picks that device's RoPE tables.
  void move_context(detail::LayerContext& ctx, Device d) const;
  Checkpointing checkpointing_ = Checkpointing::kNone;
};

// Token ids (or shifted targets, where kIgnoreIndex is allowed too) of a host tensor checked
// against the vocabulary before they are uploaded: CPU and CUDA then report the same error (the
// kernels only zero an out-of-range row). A device tensor is not read back (no check).
absl::Status check_token_ids(const Tensor& ids, int64_t vocab_size, bool targets, const char* what);

// labels i32 [batch, seq] (on the host) -> targets i32 [batch*seq] on the host: position s of a row
// is scored against labels[s + 1]; the last position has no target (-100).
Tensor shift_labels(const Tensor& labels);

// transformers' load_balancing_loss_func of the routers of a forward's MoE layers: an f32 scalar.
// With spans, over those tokens alone (its attention_mask: the masked means are means over them).
ag::Variable load_balancing_loss(const std::vector<RouterOutput>& routers, const std::vector<TokenSpan>& spans = {});
// loss + coef * aux (aux moved to loss's device, cast to its dtype), as transformers adds
// router_aux_loss_coef times aux_loss; loss itself when coef <= 0 or aux is undefined.
ag::Variable add_load_balancing(const ag::Variable& loss, const ag::Variable& aux, double coef);

// Hugging Face's causal-LM loss: logits[:, s] predicts labels[:, s+1]; mean over labels != -100.
// logits [batch, seq, vocab]; labels i32 [batch, seq].
ag::Variable causal_lm_loss(const ag::Variable& logits, const Tensor& labels, float softcap = 0.f);

}  // namespace loom
