// Qwen3 (Qwen3ForCausalLM): Qwen2's block plus a per-head RMSNorm of q and of k before RoPE
// (self_attn.q_norm / k_norm, llama.cpp's attn_q_norm / attn_k_norm); biases from `attention_bias`
// (default false) on q/k/v/o; head_dim 128 when the key is absent.
#include "models/families/families.h"

namespace loom::families {

void reject_qwen_windows(const ConfigFields& f, ModelConfig& c);  // qwen2.cpp

namespace {

void parse(const ConfigFields& f, ModelConfig& c) {
  c.attention_bias = c.o_proj_bias = f.get_bool("attention_bias", false);
  c.mlp_bias = false;
  read_hidden_act(f, c);
  reject_qwen_windows(f, c);
}

}  // namespace

const FamilySpec& qwen3() {
  static const FamilySpec spec = [] {
    FamilySpec s = qwen2();
    s.name = "qwen3";
    s.model_types = {"qwen3"};
    s.architectures = {"Qwen3ForCausalLM"};
    s.default_head_dim = 128;
    s.parse = parse;
    s.layer_weights.push_back({"self_attn.q_norm", "attn_q_norm"});
    s.layer_weights.push_back({"self_attn.k_norm", "attn_k_norm"});
    s.gguf_read_arch = s.gguf_write_arch = "qwen3";
    return s;
  }();
  return spec;
}

}  // namespace loom::families
