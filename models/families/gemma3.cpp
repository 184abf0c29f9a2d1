// Gemma 3 text (Gemma3ForCausalLM, model_type gemma3_text: 270M, 1B): Gemma 2's sandwich block with
// a per-head (1 + w) RMSNorm of q and k before RoPE, two RoPEs (the global base `rope_theta` with its
// `rope_scaling` on full-attention layers, the local base `rope_local_base_freq` unscaled on sliding
// ones; 5.x: `rope_parameters.full_attention` / `.sliding_attention`), sliding-window layers from
// `layer_types` or else every layer but each `sliding_window_pattern`-th (default 6), soft-caps only
// when set. Also the language model inside Gemma3ForConditionalGeneration (model_type gemma3: 4B, 12B,
// 27B): its keys under `text_config`, its weights under `language_model.model.` (4.x files) or
// `model.language_model.` (5.x); the vision tower is left out, and a merged model is saved as gemma3_text.
// GGUF: llama.cpp's `gemma3` in both directions (either class is written as it; see gguf_to_config).
#include "absl/strings/str_cat.h"
#include "models/families/families.h"

namespace loom::families {

void read_gemma_activation(const ConfigFields& f, ModelConfig& c);  // gemma.cpp
absl::Status gemma_gguf_to_config(const GgufFile& f, const std::string& p, nlohmann::json& j);

namespace {

// llama.cpp's gemma3 (llama-model.cpp, LLM_ARCH_GEMMA3; src/models/gemma3.cpp): with
// `attention.sliding_window` set, every layer but each 6th slides (set_swa_pattern(6)) and sliding
// layers rotate with base 10000 unscaled; without it no layer slides. The attention scale is
// head_dim^-0.5, or (hidden / heads)^-0.5 for 62 layers (27B), whatever query_pre_attn_scalar said.
// convert_hf_to_gguf.py writes no key for the pattern or the local base; newer llama.cpp builds read
// `attention.sliding_window_pattern` and `rope.freq_base_swa` when present (the reader honours them),
// older ones ignore them, so export writes neither and refuses a model that would need them.
constexpr int64_t kLlamaCppSwaPattern = 6;
constexpr double kLlamaCppLocalBase = 10000;

// set_swa_pattern(period): 0 = every layer slides, 1 = none.
bool llama_cpp_slides(int64_t layer, int64_t period = kLlamaCppSwaPattern) {
  return period == 0 || layer % period < period - 1;
}

int64_t llama_cpp_query_scalar(int64_t layers, int64_t hidden, int64_t heads, int64_t head_dim) {
  return layers == 62 ? hidden / heads : head_dim;
}

bool any_sliding(const ModelConfig& c) {
  for (bool s : c.layer_is_sliding)
    if (s) return true;
  return false;
}

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

// What convert_hf_to_gguf.py's Gemma3Model writes (the shared keys come from gguf_export.cpp; it
// writes key_length / value_length whatever the head width).
void config_to_gguf(const ModelConfig& c, const std::string& p, GgufWriter& w) {
  for (const char* key : {"attention.key_length", "attention.value_length"})
    if (!w.has(p + key)) w.add(p + key, gguf_u32(static_cast<uint32_t>(c.head_dim)));
  if (any_sliding(c)) w.add(p + "attention.sliding_window", gguf_u32(static_cast<uint32_t>(c.sliding_window)));
  if (c.final_logit_softcapping > 0) w.add(p + "final_logit_softcapping", gguf_f32(c.final_logit_softcapping));
}

absl::Status refuse(const std::string& what) {
  return absl::UnimplementedError(absl::StrCat("GGUF export: llama.cpp's gemma3 cannot hold this model: ", what));
}

// What llama.cpp's gemma3 would run differently (the sliding layers' RoPE is checked through
// gguf_sliding_rope).
absl::Status gguf_export_check(const ModelConfig& c) {
  if (any_sliding(c))
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      if (c.is_sliding(i) != llama_cpp_slides(i))
        return refuse(absl::StrCat("layer_types[", i, "] is ", c.is_sliding(i) ? "sliding" : "full",
                                   "_attention, but llama.cpp slides every layer but each ", kLlamaCppSwaPattern,
                                   "th (layers 5, 11, ... attend fully) when any layer slides"));
  const int64_t scalar = llama_cpp_query_scalar(c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.head_dim);
  if (c.query_pre_attn_scalar != static_cast<double>(scalar))
    return refuse(absl::StrCat("query_pre_attn_scalar is ", c.query_pre_attn_scalar, ", but llama.cpp scales ",
                               "attention by ", scalar, "^-0.5 (",
                               c.num_hidden_layers == 62 ? "hidden_size / heads" : "head_dim", " for ",
                               c.num_hidden_layers, " layers)"));
  if (c.rope.scaling.kind != RopeScaling::Kind::kDefault && c.rope.scaling.kind != RopeScaling::Kind::kLinear)
    return refuse(absl::StrCat("rope_scaling is ", rope_kind_name(c.rope.scaling.kind), "; llama.cpp's gemma3 reads ",
                               "none or linear"));
  if (c.attn_logit_softcapping > 0)
    return refuse(absl::StrCat("attn_logit_softcapping is ", c.attn_logit_softcapping, "; llama.cpp's gemma3 has none"));
  if (c.final_logit_softcapping > 0 && any_sliding(c))
    return refuse(absl::StrCat("final_logit_softcapping is ", c.final_logit_softcapping, " beside sliding-window ",
                               "layers; older llama.cpp builds leave it out of that graph (src/models/gemma3.cpp)"));
  if (c.attention_bias || c.o_proj_bias || c.mlp_bias)
    return refuse("attention_bias is true; llama.cpp's gemma3 loads no biases");
  if (c.hidden_act != "gelu_pytorch_tanh")
    return refuse(absl::StrCat("hidden_activation is ", c.hidden_act, "; llama.cpp's gemma3 runs gelu_pytorch_tanh"));
  return absl::OkStatus();
}

// config.json as transformers 4.5x and 5.x read it (the 4.x keys: rope_theta, rope_scaling,
// rope_local_base_freq, sliding_window_pattern beside layer_types), with what llama.cpp runs.
absl::Status gguf_to_config(const GgufFile& f, const std::string& p, nlohmann::json& j) {
  if (absl::Status s = gemma_gguf_to_config(f, p, j); !s.ok()) return s;
  const int64_t layers = j.at("num_hidden_layers");
  if (layers < 0 || layers > (int64_t{1} << 16)) return absl::OkStatus();  // config parsing refuses the count
  const int64_t window = f.get_int(p + "attention.sliding_window").value_or(0);
  int64_t period = kLlamaCppSwaPattern;
  if (const std::string key = p + "attention.sliding_window_pattern"; window > 0 && f.has(key)) {
    auto v = f.get_int(key);  // llama.cpp reads one period for gemma3, not a list per layer
    if (!v.ok() || *v < 0)
      return absl::UnimplementedError(absl::StrCat(f.path(), ": metadata '", key, "' is not one period >= 0"));
    period = *v;
  }
  nlohmann::json types = nlohmann::json::array();
  for (int64_t i = 0; i < layers; ++i)
    types.push_back(window > 0 && llama_cpp_slides(i, period) ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  if (window > 0) j["sliding_window"] = window;
  // transformers before layer_types read this (a layer slides unless (i + 1) % pattern == 0).
  if (window == 0 || period >= 1) j["sliding_window_pattern"] = window > 0 ? period : 1;
  j["rope_local_base_freq"] = f.get_float(p + "rope.freq_base_swa").value_or(kLlamaCppLocalBase);
  j["query_pre_attn_scalar"] =
      llama_cpp_query_scalar(layers, j.at("hidden_size"), j.at("num_attention_heads"), j.at("head_dim"));
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
  if (auto cap = f.get_float(p + "final_logit_softcapping"); cap.ok()) j["final_logit_softcapping"] = *cap;
  return absl::OkStatus();
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
    s.gguf_read_arch = s.gguf_write_arch = "gemma3";
    s.gguf_to_config = gguf_to_config;
    s.config_to_gguf = config_to_gguf;
    s.gguf_export_check = gguf_export_check;
    s.gguf_sliding_rope = RopeParams{};
    s.gguf_sliding_rope->theta = kLlamaCppLocalBase;
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
    s.gguf_read_arch = "";  // a gemma3 GGUF holds the language model alone: read as gemma3_text
    return s;
  }();
  return spec;
}

}  // namespace loom::families
