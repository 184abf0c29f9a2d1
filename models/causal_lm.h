// CausalLM: a decoder-only language model of any supported family (Llama, Mistral, Qwen2, Qwen3,
// Gemma, Gemma 2), loaded from a Hugging Face folder by tensor name, with the same forward pass and
// loss as transformers.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/config.h"
#include "models/layers.h"

namespace loom {

struct LoadOptions {
  DType dtype = DType::bf16;  // weights and activations (f32 or bf16)
  Device device = Device::cpu();
};

struct ForwardOptions {
  Tensor positions;    // optional i32 [batch*seq]; default 0..seq-1 in every row
  Tensor segment_ids;  // optional i32 [batch, seq]: attention stays inside a packed document
};

class CausalLM {
 public:
  // Reads config.json and the (single or sharded) safetensors. A missing tensor, a shape that
  // disagrees with the config, or a tensor the model does not use is an error naming it.
  static absl::StatusOr<std::unique_ptr<CausalLM>> load(const std::string& model_dir, const LoadOptions& options);

  const ModelConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const std::string& source_dir() const { return source_dir_; }

  // input_ids i32 [batch, seq] (on any device; moved to the model's) -> logits f32 [batch, seq, vocab].
  ag::Variable forward(const Tensor& input_ids, const ForwardOptions& options = {}) const;

  // Every Linear in model order (LoRA injection walks these).
  std::vector<Linear*> linears();
  std::vector<const Linear*> linears() const;
  // Every weight by its Hugging Face name; a tied lm_head appears only as the embedding.
  std::vector<std::pair<std::string, const ag::Variable*>> named_weights() const;

 private:
  CausalLM() = default;

  ModelConfig config_;
  DType dtype_ = DType::bf16;
  Device device_;
  std::string source_dir_;
  ag::Variable embed_tokens_;  // model.embed_tokens.weight [vocab, hidden]
  std::vector<DecoderLayer> layers_;
  RmsNorm norm_;
  Linear lm_head_;  // weight is embed_tokens_ when tied
  Tensor inv_freq_;
};

// Hugging Face's causal-LM loss: logits[:, s] predicts labels[:, s+1]; mean over labels != -100.
// logits [batch, seq, vocab]; labels i32 [batch, seq].
ag::Variable causal_lm_loss(const ag::Variable& logits, const Tensor& labels, float softcap = 0.f);

}  // namespace loom
