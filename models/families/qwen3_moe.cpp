// Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention (q/k norms, no biases unless `attention_bias`)
// with a sparse mixture-of-experts MLP: the router `mlp.gate` [experts, hidden] and per expert
// `gate_proj`, `up_proj`, `down_proj` of width `moe_intermediate_size`, the top
// `num_experts_per_tok` weights renormalised only with `norm_topk_prob` (default false), on every
// `decoder_sparse_step`-th layer not in `mlp_only_layers`; the other layers have Qwen3's dense MLP
// of width `intermediate_size` (transformers 5.17 modeling_qwen3_moe.py; tools/reference/moe_formats.md).
// head_dim: hidden_size / num_attention_heads when absent (Qwen3MoeConfig has no default of its own).
// llama.cpp's `qwen3moe` stacks the experts (blk.<i>.ffn_{gate,up,down}_exps, models/weight_map.h) and
// always renormalises, on every layer (tools/reference/moe_formats.md (e)): export refuses models it would
// compute otherwise, and a qwen3moe file reads back with norm_topk_prob true and no dense layer.
#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "models/families/families.h"

namespace loom::families {

namespace {

void parse(const ConfigFields& f, ModelConfig& c) {
  qwen3().parse(f, c);  // Qwen3's attention biases, activation and refused windows
  c.moe = read_moe_config(f, c.family->moe->rules, c.num_hidden_layers, c.intermediate_size);
}

// qwen3moe.feed_forward_length is the (unused) dense width intermediate_size, expert_feed_forward_length
// the experts' (convert_hf_to_gguf.py's Qwen2MoeModel).
absl::Status gguf_to_config(const GgufFile& f, const std::string& p, nlohmann::json& j) {
  LOOM_RETURN_IF_ERROR(moe_gguf_to_config(f, p, "num_experts", j));
  LOOM_ASSIGN_OR_RETURN(const int64_t width, f.get_int(p + "expert_feed_forward_length"));
  j["moe_intermediate_size"] = width;
  j["norm_topk_prob"] = true;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = nlohmann::json::array();
  return absl::OkStatus();
}

void config_to_gguf(const ModelConfig& c, const std::string& p, GgufWriter& w) {
  moe_config_to_gguf(c, p, w);
  w.add(p + "expert_feed_forward_length", gguf_u32(static_cast<uint32_t>(c.moe.expert_intermediate)));
}

absl::Status export_check(const ModelConfig& c) {
  if (!c.moe.renormalize)
    return absl::UnimplementedError(
        "GGUF export: norm_topk_prob is false, but llama.cpp's qwen3moe always divides the chosen experts' "
        "weights by their sum (norm_topk_prob true): it would compute another model");
  std::string dense;
  for (size_t i = 0; i < c.moe.layer_is_moe.size(); ++i)
    if (!c.moe.layer_is_moe[i]) absl::StrAppend(&dense, dense.empty() ? "" : ", ", i);
  if (!dense.empty())
    return absl::UnimplementedError(absl::StrCat(
        "GGUF export: mlp_only_layers / decoder_sparse_step make layers ", dense, " dense MLPs, but llama.cpp's ",
        "qwen3moe builds every layer as a mixture of experts and has no tensors for them"));
  return absl::OkStatus();
}

}  // namespace

const FamilySpec& qwen3_moe() {
  static const FamilySpec spec = [] {
    FamilySpec s = qwen3();
    s.name = "qwen3_moe";
    s.model_types = {"qwen3_moe"};
    s.architectures = {"Qwen3MoeForCausalLM"};
    s.default_head_dim = 0;
    s.parse = parse;
    s.layer_weights.push_back({"mlp.gate", "ffn_gate_inp"});
    FamilySpec::MoeSpec moe;
    moe.rules.default_experts = 128;
    moe.rules.default_experts_per_token = 8;
    moe.rules.own_expert_width = true;
    moe.rules.default_expert_width = 768;
    moe.rules.renormalize_key = true;
    moe.rules.sparse_layers = true;
    moe.experts = "mlp.experts";
    moe.gate = "gate_proj", moe.up = "up_proj", moe.down = "down_proj";
    moe.round_weights = true;
    s.moe = moe;
    s.gguf_read_arch = s.gguf_write_arch = "qwen3moe";
    s.gguf_to_config = gguf_to_config;
    s.config_to_gguf = config_to_gguf;
    s.gguf_export_check = export_check;
    return s;
  }();
  return spec;
}

}  // namespace loom::families
