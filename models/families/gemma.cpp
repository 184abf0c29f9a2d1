// Gemma (GemmaForCausalLM): Llama's pre-norm block with RMSNorms that compute x * (1 + w), a
// tanh-GELU gated MLP, embeddings scaled by sqrt(hidden_size) as transformers rounds it, tied
// embeddings and head_dim 256 by default. llama.cpp's `gemma` stores the norms as (1 + w)
// (GemmaModel.modify_tensors) and keeps Hugging Face's RoPE layout.
#include "models/families/families.h"

namespace loom::families {

// Gemma's activation, shared by Gemma 2: `hidden_activation`, the legacy `hidden_act` ignored.
// transformers PR #29402 (4.38-4.47) runs gelu_pytorch_tanh when `hidden_activation` is absent
// although the original gemma-*b config.json says "hidden_act": "gelu" (4.48+ regressed to exact erf
// GELU for those files; the Gemma reference implementation uses the tanh approximation).
void read_gemma_activation(const ConfigFields& f, ModelConfig& c) {
  if (f.set("hidden_activation")) {
    set_activation(f, "hidden_activation", *f.opt_string("hidden_activation"), c);
  } else if (auto legacy = f.opt_string("hidden_act")) {
    set_activation(f, "hidden_act", *legacy == "gelu" ? "gelu_pytorch_tanh" : *legacy, c);
  } else {
    c.hidden_act = "gelu_pytorch_tanh";
  }
}

absl::Status gemma_gguf_to_config(const GgufFile&, const std::string&, nlohmann::json& j) {
  j["hidden_activation"] = "gelu_pytorch_tanh";
  return absl::OkStatus();
}

namespace {

void parse(const ConfigFields& f, ModelConfig& c) {
  c.attention_bias = c.o_proj_bias = f.get_bool("attention_bias", false);
  c.mlp_bias = false;
  read_gemma_activation(f, c);
}

}  // namespace

const FamilySpec& gemma() {
  static const FamilySpec spec = [] {
    FamilySpec s;
    s.name = "gemma";
    s.model_types = {"gemma"};
    s.architectures = {"GemmaForCausalLM"};
    s.default_max_position_embeddings = 8192;
    s.default_head_dim = 256;
    s.default_tie_word_embeddings = true;
    s.default_bos = 2;
    s.default_eos = 1;
    s.default_pad = 0;
    s.parse = parse;
    s.norm_adds_one = true;
    s.embed_scale = true;
    s.top_weights = standard_top_weights(GgufFix::kNormPlusOne);
    s.layer_weights = {
        {"input_layernorm", "attn_norm", GgufFix::kNormPlusOne},
        {"self_attn.q_proj", "attn_q"},
        {"self_attn.k_proj", "attn_k"},
        {"self_attn.v_proj", "attn_v"},
        {"self_attn.o_proj", "attn_output"},
        {"post_attention_layernorm", "ffn_norm", GgufFix::kNormPlusOne},
        {"mlp.gate_proj", "ffn_gate"},
        {"mlp.up_proj", "ffn_up"},
        {"mlp.down_proj", "ffn_down"},
    };
    s.block = detail::prenorm_block;
    s.gguf_read_arch = "gemma";
    s.gguf_to_config = gemma_gguf_to_config;
    return s;
  }();
  return spec;
}

}  // namespace loom::families
