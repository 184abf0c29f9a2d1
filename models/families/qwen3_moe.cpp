// Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention (q/k norms, no biases unless `attention_bias`)
// with a sparse mixture-of-experts MLP: the router `mlp.gate` [experts, hidden] and per expert
// `gate_proj`, `up_proj`, `down_proj` of width `moe_intermediate_size`, the top
// `num_experts_per_tok` weights renormalised only with `norm_topk_prob` (default false), on every
// `decoder_sparse_step`-th layer not in `mlp_only_layers`; the other layers have Qwen3's dense MLP
// of width `intermediate_size` (transformers 5.17 modeling_qwen3_moe.py; tools/moe_formats.md).
// head_dim: hidden_size / num_attention_heads when absent (Qwen3MoeConfig has no default of its own).
#include "models/families/families.h"

namespace loom::families {

void reject_qwen_windows(const ConfigFields& f, ModelConfig& c);  // qwen2.cpp

namespace {

void parse(const ConfigFields& f, ModelConfig& c) {
  c.attention_bias = c.o_proj_bias = f.get_bool("attention_bias", false);
  c.mlp_bias = false;
  read_hidden_act(f, c);
  reject_qwen_windows(f, c);
  c.moe = read_moe_config(f, c.family->moe->rules, c.num_hidden_layers, c.intermediate_size);
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
    s.gguf_read_arch = s.gguf_write_arch = "";
    return s;
  }();
  return spec;
}

}  // namespace loom::families
