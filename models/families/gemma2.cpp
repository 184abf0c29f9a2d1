// Gemma 2 (Gemma2ForCausalLM): Gemma with "sandwich" norms (attention and MLP each between two
// norms), attention and final-logit soft-caps (`attn_logit_softcapping` 50, `final_logit_softcapping`
// 30; null = off), the attention scale query_pre_attn_scalar^-0.5 (default 256), and sliding-window
// attention (`sliding_window`, default 4096) on the layers `layer_types` names, else on even layers
// (transformers: `not bool(layer_idx % 2)`).
#include "models/families/families.h"

namespace loom::families {

void read_gemma_activation(const ConfigFields& f, ModelConfig& c);  // gemma.cpp
absl::Status gemma_gguf_to_config(const GgufFile& f, const std::string& p, nlohmann::json& j);

namespace {

void parse(const ConfigFields& f, ModelConfig& c) {
  c.attention_bias = c.o_proj_bias = f.get_bool("attention_bias", false);
  c.mlp_bias = false;
  read_gemma_activation(f, c);
  c.attn_logit_softcapping = read_softcap(f, "attn_logit_softcapping", 50.0);
  c.final_logit_softcapping = read_softcap(f, "final_logit_softcapping", 30.0);
  c.query_pre_attn_scalar = f.get_double("query_pre_attn_scalar", 256.0);
  if (!(c.query_pre_attn_scalar > 0)) f.bad("query_pre_attn_scalar", "must be > 0");
  const std::vector<std::string> types = read_layer_types(f, c.num_hidden_layers);
  c.sliding_window = read_sliding_window(f, 4096);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    c.layer_is_sliding[i] = c.sliding_window > 0 && (types.empty() ? i % 2 == 0 : types[i] == "sliding_attention");
}

absl::Status gguf_to_config(const GgufFile& f, const std::string& p, nlohmann::json& j) {
  if (absl::Status s = gemma_gguf_to_config(f, p, j); !s.ok()) return s;
  j["attn_logit_softcapping"] = f.get_float(p + "attn_logit_softcapping").value_or(50.0);
  j["final_logit_softcapping"] = f.get_float(p + "final_logit_softcapping").value_or(30.0);
  j["sliding_window"] = f.get_int(p + "attention.sliding_window").value_or(4096);
  // Not in GGUF: llama.cpp scales by head_dim^-0.5 except Gemma 2 27B (46 layers), whose
  // query_pre_attn_scalar is hidden_size / num_attention_heads (144).
  const int64_t layers = j.at("num_hidden_layers"), hidden = j.at("hidden_size"), heads = j.at("num_attention_heads");
  j["query_pre_attn_scalar"] = layers == 46 ? hidden / heads : j.at("head_dim").get<int64_t>();
  return absl::OkStatus();
}

}  // namespace

const FamilySpec& gemma2() {
  static const FamilySpec spec = [] {
    FamilySpec s = gemma();
    s.name = "gemma2";
    s.model_types = {"gemma2"};
    s.architectures = {"Gemma2ForCausalLM"};
    s.parse = parse;
    s.layer_weights = {
        {"input_layernorm", "attn_norm", GgufFix::kNormPlusOne},
        {"self_attn.q_proj", "attn_q"},
        {"self_attn.k_proj", "attn_k"},
        {"self_attn.v_proj", "attn_v"},
        {"self_attn.o_proj", "attn_output"},
        {"post_attention_layernorm", "post_attention_norm", GgufFix::kNormPlusOne},
        {"pre_feedforward_layernorm", "ffn_norm", GgufFix::kNormPlusOne},
        {"post_feedforward_layernorm", "post_ffw_norm", GgufFix::kNormPlusOne},
        {"mlp.gate_proj", "ffn_gate"},
        {"mlp.up_proj", "ffn_up"},
        {"mlp.down_proj", "ffn_down"},
    };
    s.block = detail::sandwich_block;
    s.gguf_read_arch = "gemma2";
    s.gguf_to_config = gguf_to_config;
    return s;
  }();
  return spec;
}

}  // namespace loom::families
