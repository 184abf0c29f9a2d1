// FamilySpec: everything that makes one model family different, declared in one file per family
// under models/families/ and listed in models/families/registry.cpp. The loader, the forward pass,
// config.json parsing and GGUF import/export read the spec and name no family.
//
// Adding a model family (README.md "Adding a model family" has the same recipe):
//  1. models/families/<name>.cpp: a function returning its FamilySpec: the model_types and
//     architectures it accepts, config defaults and a `parse` hook for its own keys (biases,
//     activation, windows, soft-caps; models/config_fields.h reads them with errors naming the
//     field), its weight map (Hugging Face <-> llama.cpp <-> Loom, with split/fuse rules), its
//     optional parts, and its block forward (a shared builder of models/block.h or its own).
//  2. Declare it in models/families/families.h and add it to the list in models/families/registry.cpp.
//  3. Tests: a tiny fixture made by tools/reference/make_reference.py (a new VARIANTS entry; run it on the GPU
//     machine), its name in tests/models/fixtures.h fixture_variants() (the Family suites of
//     tests/models/test_families.cpp then check logits, loss, LoRA gradients, merge and adapters
//     against transformers + PEFT), config.json cases in tests/models/test_config.cpp and, when it
//     has GGUF names, a round trip in tests/models/test_gguf_export.cpp.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/config.h"
#include "models/layers.h"
#include "nlohmann/json.hpp"

namespace loom {
class ConfigFields;
class GgufFile;
class GgufWriter;
namespace detail {
struct LayerContext;
}

// What convert_hf_to_gguf.py does to a tensor on its way into a GGUF file (undone on the way back).
enum class GgufFix {
  kNone,
  kRopePermuteQ,  // LlamaModel.permute of the rows by num_attention_heads (llama's interleaved RoPE)
  kRopePermuteK,  // the same by num_key_value_heads
  kNormPlusOne,   // GemmaModel stores (1 + w) norms as they are applied
};

// The rows of one part of a fused Hugging Face tensor, from the config.
enum class Rows { kQDim, kKvDim, kIntermediate };

// One module of the weight map (names without ".weight" / ".bias"). `hf` is the Hugging Face
// module; `loom` the Loom modules it holds, in row order: empty means the same name as `hf`; two or
// more mean a fused Hugging Face tensor (Phi-3's "self_attn.qkv_proj" -> q_proj, k_proj, v_proj)
// split along rows on load (part i has `rows[i]` rows) and concatenated back on save and export.
// `gguf` is llama.cpp's name for the Hugging Face tensor ("attn_q"; "" = none), `fix` what the
// conversion did to it.
struct WeightRule {
  std::string hf;
  std::string gguf;
  GgufFix fix = GgufFix::kNone;
  std::vector<std::string> loom = {};
  std::vector<Rows> rows = {};
};

// A decoder layer's forward: x [batch, seq, hidden] -> the same.
using BlockForward = ag::Variable (*)(const DecoderLayer& layer, const ag::Variable& x, const detail::LayerContext& ctx);

struct FamilySpec {
  std::string name;                        // the canonical model_type ("llama"); written by GGUF conversion
  std::vector<std::string> model_types;    // config.json `model_type`s it reads (name first)
  std::vector<std::string> architectures;  // transformers classes (`architectures[0]` of a converted folder first)

  // Defaults for absent keys, from transformers' configuration class.
  int64_t default_max_position_embeddings = 2048;
  int64_t default_head_dim = 0;  // `head_dim` absent (not null): 0 = hidden_size / num_attention_heads
  bool default_tie_word_embeddings = false;
  std::optional<int64_t> default_bos, default_eos, default_pad;
  double default_rope_theta = 10000;
  // A 5.x `rope_parameters` may hold one dict per layer type ({"full_attention": {...},
  // "sliding_attention": {...}}); other families reject it.
  bool rope_per_layer_type = false;
  // A multimodal checkpoint whose language model is this family: config.json keeps the language
  // model's keys under `text_config` (over `text_config_defaults`, its transformers class's defaults;
  // token ids and dtype may sit at the top level), the checkpoint keeps Loom's "model." and "lm_head"
  // tensors under one of `checkpoint_layouts` (the first whose embeddings exist), and tensors under
  // `skipped_prefixes` (the vision tower) are left out with a note. Saved as `text_model_type` /
  // `text_architecture` (the language model alone).
  std::string text_config;
  nlohmann::json text_config_defaults;
  struct CheckpointLayout {
    std::string model_prefix;    // replaces "model."
    std::string lm_head_prefix;  // replaces "lm_head."
  };
  std::vector<CheckpointLayout> checkpoint_layouts;
  std::vector<std::string> skipped_prefixes;
  std::string text_model_type, text_architecture;

  // The family's own keys, read after the shared ones (sizes, heads, eps, RoPE, tying): biases,
  // activation, soft-caps, query scale, sliding windows. Throws through ConfigFields on bad input.
  void (*parse)(const ConfigFields& fields, ModelConfig& config) = nullptr;

  // Optional parts that are not weights of their own (q/k norms and sandwich norms are: they exist
  // exactly where the weight map lists them).
  bool norm_adds_one = false;  // RMSNorm computes x * (1 + w) (Gemma)
  bool embed_scale = false;    // embeddings times sqrt(hidden_size) rounded to the model dtype (Gemma)
  bool partial_rotary = false; // `partial_rotary_factor` < 1 rotates only the head's leading dims (Phi-3)

  // Weight map: the model-level modules ("model.embed_tokens", "model.norm", "lm_head") and one
  // decoder layer's (under "model.layers.<i>." and llama.cpp's "blk.<i>.").
  std::vector<WeightRule> top_weights;
  std::vector<WeightRule> layer_weights;

  BlockForward block = nullptr;

  // Mixture of experts (Mixtral, Qwen3-MoE): the config rules (models/moe_config.h) and where each
  // expert's matrices live in Hugging Face checkpoints: "model.layers.<i>.<experts>.<e>.<gate>.weight"
  // and the same for up and down. In Loom (as transformers 5.x holds them in memory) a MoE layer
  // has the router "mlp.gate" (a rule of the weight map names its checkpoint tensor and GGUF name)
  // and the experts stacked: "mlp.experts.gate_up_proj" [E, 2 I, hidden] (gate rows, then up rows)
  // and "mlp.experts.down_proj" [E, hidden, I]. Dense layers of the family use the Mlp modules.
  struct MoeSpec {
    MoeRules rules;
    std::string experts;          // "block_sparse_moe.experts" (Mixtral's hub name) or "mlp.experts"
    std::string gate, up, down;   // "w1", "w3", "w2" or "gate_proj", "up_proj", "down_proj"
    // The routing weights rounded to the model dtype before they scale the experts (Qwen3-MoE).
    bool round_weights = false;
  };
  std::optional<MoeSpec> moe;

  // GGUF: llama.cpp's `general.architecture` this family reads ("" = none), and the one it is
  // written as ("" = export not supported), with the family's metadata in both directions. A family
  // with experts reads the files of its architecture that have them (`<arch>.expert_count` > 0, the
  // stacked blk.<i>.ffn_{gate,up,down}_exps), one without the others: Mixtral and Llama share `llama`.
  std::string gguf_read_arch;
  std::string gguf_write_arch;
  // Adds the family's keys to config.json rebuilt from GGUF metadata (`p` is "<arch>.").
  absl::Status (*gguf_to_config)(const GgufFile& file, const std::string& p, nlohmann::json& config) = nullptr;
  // Adds the family's <arch>.* metadata on export.
  void (*config_to_gguf)(const ModelConfig& config, const std::string& p, GgufWriter& w) = nullptr;
  // What llama.cpp's architecture cannot hold of this model, checked before anything is written:
  // Unimplemented naming the config field and what llama.cpp does instead; OK when it can.
  absl::Status (*gguf_export_check)(const ModelConfig& config) = nullptr;
  // The RoPE llama.cpp's architecture gives sliding-window layers by itself, held by no metadata key
  // (gemma3: base 10000, unscaled); unset: the full-attention layers' RoPE. Export refuses a model
  // whose sliding layers have another.
  std::optional<RopeParams> gguf_sliding_rope;
  // A warning to print when exporting (what llama.cpp's architecture drops), "" for none.
  std::string (*gguf_export_warning)(const ModelConfig& config) = nullptr;

  // The rule whose Loom modules include `loom_module` (layer-relative or model-level), or null.
  const WeightRule* rule_for_loom(const std::string& loom_module, bool in_layer) const;
  bool has_layer_module(const std::string& loom_module) const { return rule_for_loom(loom_module, true) != nullptr; }
};

// The registry (models/families/registry.cpp): every family, in the order messages list them.
const std::vector<const FamilySpec*>& model_families();
// `model_type` -> its family; InvalidArgument listing the supported types otherwise.
absl::StatusOr<const FamilySpec*> family_from_model_type(const std::string& model_type);
const FamilySpec* family_from_architecture(const std::string& architecture);  // null when none
// The family that reads GGUF files of `arch` whose experts are stacked (`<arch>.expert_count` > 0:
// llama.cpp's `llama` holds Mixtral too) or not; null when none.
const FamilySpec* family_from_gguf_architecture(const std::string& arch, bool experts = false);
// "llama, mistral, ..." of the families for which `pred` holds.
std::string family_names(bool (*pred)(const FamilySpec&));

}  // namespace loom
