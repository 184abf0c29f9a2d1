// Qwen2 / Qwen2.5 (Qwen2ForCausalLM): the pre-norm block with biased q/k/v projections (always: its
// attention hard-codes them) and no o_proj or MLP bias. Sliding-window attention (`use_sliding_window`,
// `sliding_attention` layer types) is rejected; transformers drops `sliding_window` when
// use_sliding_window is false. llama.cpp's `qwen2` keeps Hugging Face's RoPE layout (no permutation).
#include "models/families/families.h"

namespace loom::families {

// Qwen2's and Qwen3's windows: Loom implements none.
void reject_qwen_windows(const ConfigFields& f, ModelConfig& c) {
  if (f.get_bool("use_sliding_window", false))
    f.bad("use_sliding_window", "sliding-window attention in Qwen models is not supported by Loom");
  for (const std::string& t : read_layer_types(f, c.num_hidden_layers))
    if (t == "sliding_attention") f.bad("layer_types", "sliding_attention layers in Qwen models are not supported by Loom");
}

namespace {

void parse(const ConfigFields& f, ModelConfig& c) {
  c.attention_bias = true;
  c.o_proj_bias = c.mlp_bias = false;
  read_hidden_act(f, c);
  reject_qwen_windows(f, c);
}

}  // namespace

const FamilySpec& qwen2() {
  static const FamilySpec spec = [] {
    FamilySpec s;
    s.name = "qwen2";
    s.model_types = {"qwen2"};
    s.architectures = {"Qwen2ForCausalLM"};
    s.default_max_position_embeddings = 32768;
    s.parse = parse;
    s.top_weights = standard_top_weights(GgufFix::kNone);
    s.layer_weights = {
        {"input_layernorm", "attn_norm"},
        {"self_attn.q_proj", "attn_q"},
        {"self_attn.k_proj", "attn_k"},
        {"self_attn.v_proj", "attn_v"},
        {"self_attn.o_proj", "attn_output"},
        {"post_attention_layernorm", "ffn_norm"},
        {"mlp.gate_proj", "ffn_gate"},
        {"mlp.up_proj", "ffn_up"},
        {"mlp.down_proj", "ffn_down"},
    };
    s.block = detail::prenorm_block;
    s.gguf_read_arch = s.gguf_write_arch = "qwen2";
    return s;
  }();
  return spec;
}

}  // namespace loom::families
