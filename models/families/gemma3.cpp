// Gemma 3 text (Gemma3ForCausalLM, model_type gemma3_text: 270M, 1B): Gemma 2's sandwich block with
// a per-head (1 + w) RMSNorm of q and k before RoPE, two RoPEs (the global base `rope_theta` with its
// `rope_scaling` on full-attention layers, the local base `rope_local_base_freq` unscaled on sliding
// ones; 5.x: `rope_parameters.full_attention` / `.sliding_attention`), sliding-window layers from
// `layer_types` or else every layer but each `sliding_window_pattern`-th (default 6), soft-caps only
// when set. Also the language model inside Gemma3ForConditionalGeneration (model_type gemma3: 4B, 12B,
// 27B): its keys under `text_config`, its weights under `language_model.model.` (4.x files) or
// `model.language_model.` (5.x); the vision tower is left out, and a merged model is saved as gemma3_text.
#include "models/families/families.h"

namespace loom::families {

void read_gemma_activation(const ConfigFields& f, ModelConfig& c);  // gemma.cpp

namespace {

void parse(const ConfigFields& f, ModelConfig& c) {
  c.attention_bias = c.o_proj_bias = f.get_bool("attention_bias", false);
  c.mlp_bias = false;
  read_gemma_activation(f, c);
  c.attn_logit_softcapping = read_softcap(f, "attn_logit_softcapping", 0);
  c.final_logit_softcapping = read_softcap(f, "final_logit_softcapping", 0);
  c.query_pre_attn_scalar = f.get_double("query_pre_attn_scalar", 256.0);
  if (!(c.query_pre_attn_scalar > 0)) f.bad("query_pre_attn_scalar", "must be > 0");
  // 4.x (and a 5.x file without per-type dicts): the sliding layers' base is its own key, unscaled.
  const bool per_type = f.set("rope_parameters") && f.at("rope_parameters").is_object() &&
                        f.at("rope_parameters").contains("sliding_attention");
  if (!per_type) {
    c.rope_sliding = RopeParams{};
    c.rope_sliding.theta = f.get_double("rope_local_base_freq", 10000.0);
    if (!(c.rope_sliding.theta > 0)) f.bad("rope_local_base_freq", "must be > 0");
  }
  const std::vector<std::string> types = read_layer_types(f, c.num_hidden_layers);
  const int64_t pattern = f.get_int("sliding_window_pattern", 6);
  if (types.empty() && pattern < 1) f.bad("sliding_window_pattern", "must be >= 1");
  c.sliding_window = read_sliding_window(f, 4096);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    c.layer_is_sliding[i] =
        c.sliding_window > 0 && (types.empty() ? (i + 1) % pattern != 0 : types[i] == "sliding_attention");
}

}  // namespace

const FamilySpec& gemma3() {
  static const FamilySpec spec = [] {
    FamilySpec s = gemma2();
    s.name = "gemma3_text";
    s.model_types = {"gemma3_text"};
    s.architectures = {"Gemma3ForCausalLM"};
    s.default_max_position_embeddings = 131072;
    s.default_rope_theta = 1e6;
    s.rope_per_layer_type = true;
    s.parse = parse;
    s.layer_weights.push_back({"self_attn.q_norm", "attn_q_norm", GgufFix::kNormPlusOne});
    s.layer_weights.push_back({"self_attn.k_norm", "attn_k_norm", GgufFix::kNormPlusOne});
    s.gguf_read_arch = "";  // llama.cpp's gemma3: not mapped yet
    s.gguf_to_config = nullptr;
    return s;
  }();
  return spec;
}

const FamilySpec& gemma3_multimodal() {
  static const FamilySpec spec = [] {
    FamilySpec s = gemma3();
    s.name = "gemma3";
    s.model_types = {"gemma3"};
    s.architectures = {"Gemma3ForConditionalGeneration"};
    s.text_config = "text_config";
    // Gemma3TextConfig's defaults for the sizes (published text_configs leave vocab_size out).
    s.text_config_defaults = {{"vocab_size", 262208},      {"hidden_size", 2304},      {"intermediate_size", 9216},
                              {"num_hidden_layers", 26},   {"num_attention_heads", 8}, {"num_key_value_heads", 4}};
    s.checkpoint_layouts = {{"language_model.model.", "language_model.lm_head."}, {"model.language_model.", "lm_head."}};
    s.skipped_prefixes = {"vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."};
    s.text_model_type = "gemma3_text";
    s.text_architecture = "Gemma3ForCausalLM";
    return s;
  }();
  return spec;
}

}  // namespace loom::families
