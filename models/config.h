// ModelConfig: the architecture of a Hugging Face model as its config.json describes it (transformers
// 4.x and 5.x key spellings), with each family's defaults for absent keys taken from transformers'
// configuration classes, and clear errors for options Loom does not implement.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/rope.h"

namespace loom {

enum class ModelFamily { kLlama, kMistral, kQwen2, kQwen3, kGemma, kGemma2 };

// "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2" -> the family; anything else is an
// InvalidArgument listing the supported types.
absl::StatusOr<ModelFamily> family_from_model_type(const std::string& model_type);
const char* model_type_name(ModelFamily family);

struct ModelConfig {
  ModelFamily family = ModelFamily::kLlama;
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
  // Absent or null: hidden_size / num_attention_heads, except qwen3 (128), gemma and gemma2 (256).
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;

  double rms_norm_eps = 1e-6;  // every supported family defaults to 1e-6
  double rope_theta = 10000;
  RopeScaling rope_scaling;

  bool tie_word_embeddings = false;  // gemma, gemma2 default true; the others false
  // q/k/v projections carry a bias. qwen2: always (its attention hard-codes it); mistral: never;
  // llama, qwen3, gemma, gemma2: the `attention_bias` key (default false).
  bool attention_bias = false;
  // o_proj carries a bias: `attention_bias` for llama, qwen3, gemma, gemma2; never for qwen2 and mistral.
  bool o_proj_bias = false;
  bool mlp_bias = false;  // llama's `mlp_bias` (gate/up/down); false for the other families

  // "silu" or "gelu_pytorch_tanh" ("swish" and "gelu_new" are read as these, as ACT2FN aliases
  // them). gemma/gemma2 read `hidden_activation` and ignore the legacy `hidden_act`: transformers
  // PR #29402 (4.38-4.47) runs gelu_pytorch_tanh when `hidden_activation` is absent although the
  // original gemma-*b config.json says "hidden_act": "gelu" (4.48+ regressed to exact erf GELU for
  // those files; the Gemma reference implementation uses the tanh approximation).
  std::string hidden_act = "silu";

  float attn_logit_softcapping = 0;   // gemma2 (default 50; null -> 0 = off)
  float final_logit_softcapping = 0;  // gemma2 (default 30; null -> 0 = off)
  double query_pre_attn_scalar = 0;   // gemma2 (default 256): attention scale = this^-0.5
  int64_t sliding_window = 0;         // 0 = none
  // One entry per layer: true where attention is limited to the last `sliding_window` positions.
  // gemma2: from `layer_types` ("sliding_attention" / "full_attention") if present, else even layers
  // slide (transformers: `not bool(layer_idx % 2)`); mistral: every layer when sliding_window is set;
  // the others never. All false when sliding_window == 0.
  std::vector<bool> layer_is_sliding;

  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;  // eos_token_id: the first of a list
  std::vector<int64_t> eos_token_ids;                               // every eos id ([] when none)
  std::string torch_dtype;  // "dtype" (5.x) or "torch_dtype" (4.x): "bfloat16", ...; "" when absent

  // Parses config.json text; `origin` (the file path) prefixes every error message.
  static absl::StatusOr<ModelConfig> from_json_text(const std::string& text, const std::string& origin);
  // Reads model_dir/config.json.
  static absl::StatusOr<ModelConfig> load(const std::string& model_dir);

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  // Softmax scale of q.k: query_pre_attn_scalar^-0.5 for gemma2, else head_dim^-0.5.
  float attention_scale() const;
  // One line for logs: "llama: 32 layers, hidden 4096, heads 32/8 x 128, ...".
  std::string summary() const;
};

}  // namespace loom
