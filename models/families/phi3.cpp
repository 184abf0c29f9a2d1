// Phi-3 (Phi3ForCausalLM, model_type phi3: Phi-3-mini/medium, Phi-3.5-mini, Phi-4, Phi-4-mini): Llama's
// pre-norm block with q, k and v fused into one `qkv_proj` (rows q, then k, then v) and gate and up into
// one `gate_up_proj` (rows gate, then up). They stay fused in Loom, as in the checkpoints, llama.cpp's
// phi3 (attn_qkv, ffn_up) and PEFT, whose LoRA on qkv_proj has one A for all three. RoPE default or
// LongRoPE (`longrope`, legacy `su`: short factors up to original_max_position_embeddings, long ones
// beyond, cos and sin scaled), `partial_rotary_factor` (Phi-4-mini rotates 3/4 of each head), and
// `sliding_window` on every layer when set (Phi-3-mini-4k: 2047). No biases.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "models/families/families.h"

namespace loom::families {
namespace {

void parse(const ConfigFields& f, ModelConfig& c) {
  c.attention_bias = c.o_proj_bias = c.mlp_bias = false;
  read_hidden_act(f, c);
  c.sliding_window = read_sliding_window(f, 0);
  c.layer_is_sliding.assign(static_cast<size_t>(c.num_hidden_layers), c.sliding_window > 0);
}

// llama.cpp's phi3 keys (convert_hf_to_gguf.py Phi3MiniModel): the rotated dims, the window, and
// LongRoPE's pretrained length and attention factor (its factor lists are the tensors
// rope_factors_short/long, which gguf_model.cpp and gguf_export.cpp map generically).
void config_to_gguf(const ModelConfig& c, const std::string& p, GgufWriter& w) {
  w.add(p + "rope.dimension_count", gguf_u32(static_cast<uint32_t>(c.rope.rotary_dim(c.head_dim))));
  if (c.sliding_window > 0) w.add(p + "attention.sliding_window", gguf_u32(static_cast<uint32_t>(c.sliding_window)));
  if (c.rope.scaling.kind == RopeScaling::Kind::kLongRope) {
    w.add(p + "rope.scaling.original_context_length",
          gguf_u32(static_cast<uint32_t>(c.rope.scaling.original_max_position_embeddings)));
    w.add(p + "rope.scaling.attn_factor", gguf_f32(static_cast<float>(c.rope.scaling.attention_factor)));
  }
}

absl::Status gguf_to_config(const GgufFile& f, const std::string& p, nlohmann::json& j) {
  if (auto w = f.get_int(p + "attention.sliding_window"); w.ok()) j["sliding_window"] = *w;
  if (auto orig = f.get_int(p + "rope.scaling.original_context_length"); orig.ok())
    j["original_max_position_embeddings"] = *orig;
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object() && j["rope_scaling"].value("type", "") == "longrope")
    if (auto a = f.get_float(p + "rope.scaling.attn_factor"); a.ok()) j["rope_scaling"]["attention_factor"] = *a;
  return absl::OkStatus();
}

}  // namespace

const FamilySpec& phi3() {
  static const FamilySpec spec = [] {
    FamilySpec s;
    s.name = "phi3";
    s.model_types = {"phi3"};
    s.architectures = {"Phi3ForCausalLM"};
    s.default_max_position_embeddings = 4096;
    s.default_bos = 1;
    s.default_eos = 32000;
    s.default_pad = 32000;
    s.partial_rotary = true;
    s.parse = parse;
    s.top_weights = standard_top_weights(GgufFix::kNone);
    s.layer_weights = {
        {"input_layernorm", "attn_norm"},
        {"self_attn.qkv_proj", "attn_qkv"},
        {"self_attn.o_proj", "attn_output"},
        {"post_attention_layernorm", "ffn_norm"},
        {"mlp.gate_up_proj", "ffn_up"},
        {"mlp.down_proj", "ffn_down"},
    };
    s.block = detail::prenorm_block;
    s.gguf_read_arch = s.gguf_write_arch = "phi3";
    s.gguf_to_config = gguf_to_config;
    s.config_to_gguf = config_to_gguf;
    return s;
  }();
  return spec;
}

}  // namespace loom::families
