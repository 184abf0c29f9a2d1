// ModelConfig: the architecture of a Hugging Face model as its config.json describes it (transformers
// 4.x and 5.x key spellings), with each family's defaults for absent keys taken from transformers'
// configuration classes (declared in the family's spec, models/families/), and clear errors for
// options Loom does not implement.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "models/moe_config.h"
#include "models/rope_scaling.h"

namespace loom {

struct FamilySpec;  // models/family.h

struct ModelConfig {
  const FamilySpec* family = nullptr;  // set by parsing: never null in a parsed config
  std::string model_type = "llama";

  // Required in config.json (no silent 7B-sized defaults): vocab_size, hidden_size,
  // intermediate_size, num_hidden_layers, num_attention_heads.
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  // Absent or null: num_attention_heads (LlamaConfig's rule; the other transformers classes' own
  // defaults fit only their default head counts, and their published configs always state it).
  int64_t num_key_value_heads = 0;
  // Absent: the family's default head_dim, or hidden_size / num_attention_heads; null: the latter.
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;

  double rms_norm_eps = 1e-6;  // every supported family defaults to 1e-6
  // RoPE per layer type: `rope` for full-attention layers (and every layer of a one-RoPE family),
  // `rope_sliding` for sliding-window layers, equal to `rope` unless the family reads a base of their
  // own (5.x `rope_parameters.sliding_attention`).
  RopeParams rope;
  RopeParams rope_sliding;

  // The rest is set by the family's parse hook: models/families/<family>.cpp says which keys it
  // reads and their defaults.
  bool tie_word_embeddings = false;
  bool attention_bias = false;        // q/k/v projections carry a bias
  bool o_proj_bias = false;           // o_proj carries a bias
  bool mlp_bias = false;              // gate/up/down carry a bias
  std::string hidden_act = "silu";    // "silu" or "gelu_pytorch_tanh"
  float attn_logit_softcapping = 0;   // 0 = off
  float final_logit_softcapping = 0;  // 0 = off
  double query_pre_attn_scalar = 0;   // > 0: attention scale = this^-0.5 (else head_dim^-0.5)
  int64_t sliding_window = 0;         // 0 = none
  // One entry per layer: true where attention is limited to the last `sliding_window` positions.
  // All false when sliding_window == 0.
  std::vector<bool> layer_is_sliding;
  // Mixture of experts (the families with a FamilySpec::moe): experts 0 for a dense model.
  MoeConfig moe;

  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;  // eos_token_id: the first of a list
  std::vector<int64_t> eos_token_ids;                               // every eos id ([] when none)
  std::string torch_dtype;  // "dtype" (5.x) or "torch_dtype" (4.x): "bfloat16", ...; "" when absent

  // The language model's config.json of a multimodal family (FamilySpec::text_config): the text
  // config over its class defaults, with top-level token ids and dtype, as the text family names it.
  // Other families' configs come back unchanged.
  static nlohmann::json language_model_json(const nlohmann::json& config_json, const FamilySpec& family);
  // Parses config.json text; `origin` (the file path) prefixes every error message.
  static absl::StatusOr<ModelConfig> from_json_text(const std::string& text, const std::string& origin);
  // Reads model_dir/config.json.
  static absl::StatusOr<ModelConfig> load(const std::string& model_dir);

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  bool is_sliding(int64_t layer) const {
    return layer >= 0 && layer < static_cast<int64_t>(layer_is_sliding.size()) && layer_is_sliding[layer];
  }
  // The RoPE of layer `layer`'s type.
  const RopeParams& rope_for_layer(int64_t layer) const { return is_sliding(layer) ? rope_sliding : rope; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  bool is_moe_layer(int64_t layer) const {
    return moe.experts > 0 && layer >= 0 && layer < static_cast<int64_t>(moe.layer_is_moe.size()) && moe.layer_is_moe[layer];
  }
  // Softmax scale of q.k: query_pre_attn_scalar^-0.5 when set, else head_dim^-0.5.
  float attention_scale() const;
  // One line for logs: "llama: 32 layers, hidden 4096, heads 32/8 x 128, ...".
  std::string summary() const;
};

}  // namespace loom
