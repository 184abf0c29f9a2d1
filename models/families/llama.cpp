// Llama (LlamaForCausalLM): the pre-norm block with a SiLU-gated MLP; optional q/k/v/o biases
// (`attention_bias`) and MLP biases (`mlp_bias`); RoPE default, linear or llama3. llama.cpp's `llama`
// architecture rotates interleaved pairs, so convert_hf_to_gguf.py permutes the q and k rows.
#include "models/families/families.h"

namespace loom::families {
namespace {

void parse(const ConfigFields& f, ModelConfig& c) {
  c.attention_bias = c.o_proj_bias = f.get_bool("attention_bias", false);
  c.mlp_bias = f.get_bool("mlp_bias", false);
  read_hidden_act(f, c);
}

absl::Status gguf_to_config(const GgufFile& f, const std::string&, nlohmann::json& j) {
  j["attention_bias"] = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  j["mlp_bias"] = f.find_tensor("blk.0.ffn_gate.bias") != nullptr;
  return absl::OkStatus();
}

}  // namespace

// llama.cpp's `llama` architecture also reads these (convert_hf_to_gguf.py's LlamaModel writes them).
void llama_config_to_gguf(const ModelConfig& c, const std::string& p, GgufWriter& w) {
  w.add(p + "vocab_size", gguf_u32(static_cast<uint32_t>(c.vocab_size)));
  w.add(p + "rope.dimension_count", gguf_u32(static_cast<uint32_t>(c.head_dim)));
}

const FamilySpec& llama() {
  static const FamilySpec spec = [] {
    FamilySpec s;
    s.name = "llama";
    s.model_types = {"llama"};
    s.architectures = {"LlamaForCausalLM"};
    s.default_max_position_embeddings = 2048;
    s.default_bos = 1;
    s.default_eos = 2;
    s.parse = parse;
    s.top_weights = standard_top_weights(GgufFix::kNone);
    s.layer_weights = {
        {"input_layernorm", "attn_norm"},
        {"self_attn.q_proj", "attn_q", GgufFix::kRopePermuteQ},
        {"self_attn.k_proj", "attn_k", GgufFix::kRopePermuteK},
        {"self_attn.v_proj", "attn_v"},
        {"self_attn.o_proj", "attn_output"},
        {"post_attention_layernorm", "ffn_norm"},
        {"mlp.gate_proj", "ffn_gate"},
        {"mlp.up_proj", "ffn_up"},
        {"mlp.down_proj", "ffn_down"},
    };
    s.block = detail::prenorm_block;
    s.gguf_read_arch = s.gguf_write_arch = "llama";
    s.gguf_to_config = gguf_to_config;
    s.config_to_gguf = llama_config_to_gguf;
    return s;
  }();
  return spec;
}

}  // namespace loom::families
