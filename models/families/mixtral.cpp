// Mixtral (MixtralForCausalLM): Mistral's attention (no biases; a sliding window only when
// `sliding_window` is set, null by default) with a sparse mixture-of-experts MLP on every layer:
// the router `block_sparse_moe.gate` [experts, hidden] and per expert `w1` (gate), `w3` (up), `w2`
// (down) of width `intermediate_size`, the top `num_experts_per_tok` weights always renormalised
// (transformers 5.17 modeling_mixtral.py; tools/reference/moe_formats.md). transformers 5.x holds the block at
// `mlp` with the experts stacked; its save_pretrained writes the hub's per-expert names (read here
// either way). llama.cpp converts Mixtral as `llama` with q/k permuted and the experts stacked
// (blk.<i>.ffn_{gate,up,down}_exps, models/weight_map.h), `llama.expert_count` telling it apart from a
// Llama file; its llama graph always renormalises, as Mixtral does, and has no sliding window.
#include "engine/status_macros.h"
#include "models/families/families.h"

namespace loom::families {

void llama_config_to_gguf(const ModelConfig& c, const std::string& p, GgufWriter& w);  // llama.cpp
std::string sliding_window_export_warning(const ModelConfig& c);                      // mistral.cpp

namespace {

// llama.feed_forward_length (the shared intermediate_size) is the experts' width in llama.cpp's llama.
absl::Status gguf_to_config(const GgufFile& f, const std::string& p, nlohmann::json& j) {
  LOOM_RETURN_IF_ERROR(moe_gguf_to_config(f, p, "num_local_experts", j));
  j["sliding_window"] = nullptr;
  return absl::OkStatus();
}

void config_to_gguf(const ModelConfig& c, const std::string& p, GgufWriter& w) {
  llama_config_to_gguf(c, p, w);
  moe_config_to_gguf(c, p, w);
}

void parse(const ConfigFields& f, ModelConfig& c) {
  c.attention_bias = c.o_proj_bias = c.mlp_bias = false;
  read_hidden_act(f, c);
  c.sliding_window = read_sliding_window(f, 0);
  c.layer_is_sliding.assign(static_cast<size_t>(c.num_hidden_layers), c.sliding_window > 0);
  c.moe = read_moe_config(f, c.family->moe->rules, c.num_hidden_layers, c.intermediate_size);
}

}  // namespace

const FamilySpec& mixtral() {
  static const FamilySpec spec = [] {
    FamilySpec s = llama();
    s.name = "mixtral";
    s.model_types = {"mixtral"};
    s.architectures = {"MixtralForCausalLM"};
    s.default_max_position_embeddings = 4096 * 32;
    s.default_rope_theta = 1e6;
    s.parse = parse;
    // Llama's attention and norms; the router where the dense MLP was (the experts follow MoeSpec).
    std::erase_if(s.layer_weights, [](const WeightRule& r) { return r.hf.starts_with("mlp."); });
    s.layer_weights.push_back({"block_sparse_moe.gate", "ffn_gate_inp", GgufFix::kNone, {"mlp.gate"}});
    FamilySpec::MoeSpec moe;
    moe.rules.default_experts = 8;
    moe.rules.default_experts_per_token = 2;
    moe.experts = "block_sparse_moe.experts";
    moe.gate = "w1", moe.up = "w3", moe.down = "w2";
    s.moe = moe;
    s.gguf_read_arch = s.gguf_write_arch = "llama";  // with llama.expert_count; a Llama file is llama
    s.gguf_to_config = gguf_to_config;
    s.config_to_gguf = config_to_gguf;
    s.gguf_export_warning = sliding_window_export_warning;
    return s;
  }();
  return spec;
}

}  // namespace loom::families
