// ModelConfig parsing: a typed view over config.json (every error names the file and the field),
// the per-family defaults of transformers' configuration classes, RoPE in its 4.x (`rope_theta` +
// `rope_scaling`) and 5.x (`rope_parameters`) forms, and validation of what Loom implements.
#include "models/config.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "engine/io_error.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

using nlohmann::json;

constexpr const char* kSupportedTypes = "llama, mistral, qwen2, qwen3, gemma, gemma2";
constexpr const char* kSupportedRope = "default, linear, llama3";

// Thrown inside this file only; from_json_text turns it into the returned Status.
struct ConfigError {
  absl::Status status;
};

[[noreturn]] void fail(std::string msg) { throw ConfigError{absl::InvalidArgumentError(std::move(msg))}; }

std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Typed access to one JSON object; `where` is "config.json" or "config.json: rope_scaling" and
// `prefix` the dotted path of the object ("" or "rope_scaling.") for messages.
class Fields {
 public:
  Fields(const json& obj, std::string where, std::string prefix)
      : obj_(obj), where_(std::move(where)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return obj_.contains(key); }
  // Present and not null.
  bool set(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  const json& at(const char* key) const { return obj_.at(key); }

  [[noreturn]] void wrong(const char* key, const char* expected) const {
    fail(absl::StrCat(where_, ": field '", prefix_, key, "' is ", show(obj_.at(key)), " (a JSON ",
                      obj_.at(key).type_name(), "), expected ", expected));
  }
  [[noreturn]] void missing(const char* key, const char* what) const {
    fail(absl::StrCat(where_, ": missing required field '", prefix_, key, "' (", what, ")"));
  }
  [[noreturn]] void bad(const char* key, const std::string& why) const {
    fail(absl::StrCat(where_, ": field '", prefix_, key, "' = ", show(obj_.at(key)), ": ", why));
  }

  std::optional<int64_t> opt_int(const char* key) const {
    if (!set(key)) return std::nullopt;
    const json& v = obj_.at(key);
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) wrong(key, "an integer that fits in 64 bits");
      return static_cast<int64_t>(v.get<uint64_t>());
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    wrong(key, "an integer");
  }
  int64_t req_int(const char* key, const char* what) const {
    if (!set(key)) missing(key, what);
    return *opt_int(key);
  }
  int64_t get_int(const char* key, int64_t dflt) const { return opt_int(key).value_or(dflt); }
  std::optional<double> opt_double(const char* key) const {
    if (!set(key)) return std::nullopt;
    const json& v = obj_.at(key);
    if (!v.is_number()) wrong(key, "a number");
    return v.get<double>();
  }
  double get_double(const char* key, double dflt) const { return opt_double(key).value_or(dflt); }
  double req_double(const char* key, const char* what) const {
    if (!set(key)) missing(key, what);
    return *opt_double(key);
  }
  bool get_bool(const char* key, bool dflt) const {
    if (!set(key)) return dflt;
    if (!obj_.at(key).is_boolean()) wrong(key, "true or false");
    return obj_.at(key).get<bool>();
  }
  std::optional<std::string> opt_string(const char* key) const {
    if (!set(key)) return std::nullopt;
    if (!obj_.at(key).is_string()) wrong(key, "a string");
    return obj_.at(key).get<std::string>();
  }

  const std::string& where() const { return where_; }

 private:
  const json& obj_;
  std::string where_;
  std::string prefix_;
};

// The scaling dict of either version (4.x `rope_scaling` or 5.x `rope_parameters`), whose object
// is `f`; `name` is the key it came from.
RopeScaling parse_rope_scaling(const Fields& f, const std::string& name) {
  // transformers: rope_type wins over the legacy "type"; neither means the default rotation.
  std::string type = "default";
  if (auto t = f.opt_string("rope_type"))
    type = *t;
  else if (auto t2 = f.opt_string("type"))
    type = *t2;
  RopeScaling s;
  if (type == "default") return s;
  if (type == "linear") {
    s.kind = RopeScaling::Kind::kLinear;
    s.factor = f.req_double("factor", "linear RoPE scaling needs its factor");
    if (!(s.factor > 0)) f.bad("factor", "must be > 0");
    return s;
  }
  if (type == "llama3") {
    s.kind = RopeScaling::Kind::kLlama3;
    s.factor = f.req_double("factor", "llama3 RoPE scaling needs it");
    s.low_freq_factor = f.req_double("low_freq_factor", "llama3 RoPE scaling needs it");
    s.high_freq_factor = f.req_double("high_freq_factor", "llama3 RoPE scaling needs it");
    s.original_max_position_embeddings =
        f.req_double("original_max_position_embeddings", "llama3 RoPE scaling needs it");
    if (!(s.factor > 0)) f.bad("factor", "must be > 0");
    if (!(s.original_max_position_embeddings > 0)) f.bad("original_max_position_embeddings", "must be > 0");
    if (!(s.high_freq_factor > s.low_freq_factor) || !(s.low_freq_factor > 0))
      fail(absl::StrCat(f.where(), ": ", name, " has low_freq_factor ", s.low_freq_factor, " and high_freq_factor ",
                        s.high_freq_factor, ": llama3 RoPE needs 0 < low_freq_factor < high_freq_factor"));
    return s;
  }
  fail(absl::StrCat(f.where(), ": ", name, " has rope_type '", type,
                    "', which Loom does not support (supported: ", kSupportedRope, ")"));
}

// Fills rope_theta and rope_scaling from either form. 5.x `rope_parameters` wins when both appear
// (transformers 5 writes only it; 4.x files have only the top-level keys).
void parse_rope(const Fields& top, const json& j, const std::string& origin, ModelConfig* c) {
  c->rope_theta = top.get_double("rope_theta", 10000.0);
  if (top.set("rope_parameters")) {
    const json& rp = j.at("rope_parameters");
    if (!rp.is_object())
      top.wrong("rope_parameters", "an object such as {\"rope_type\": \"default\", \"rope_theta\": 10000}");
    for (const auto& [k, v] : rp.items())
      if (v.is_object())
        fail(absl::StrCat(origin, ": rope_parameters holds a per-layer-type dict ('", k,
                          "': {...}, as Gemma 3 writes); Loom supports one RoPE for all layers"));
    Fields f(rp, origin, "rope_parameters.");
    c->rope_theta = f.get_double("rope_theta", c->rope_theta);
    c->rope_scaling = parse_rope_scaling(f, "rope_parameters");
    if (f.set("partial_rotary_factor") && f.get_double("partial_rotary_factor", 1) != 1)
      f.bad("partial_rotary_factor", "partial rotary embeddings are not supported");
  } else if (top.set("rope_scaling")) {
    const json& rs = j.at("rope_scaling");
    if (!rs.is_object()) top.wrong("rope_scaling", "an object such as {\"rope_type\": \"llama3\", \"factor\": 8, ...}");
    c->rope_scaling = parse_rope_scaling(Fields(rs, origin, "rope_scaling."), "rope_scaling");
  }
  if (!(c->rope_theta > 0)) fail(absl::StrCat(origin, ": rope_theta is ", c->rope_theta, ", expected > 0"));
  if (top.set("partial_rotary_factor") && top.get_double("partial_rotary_factor", 1) != 1)
    top.bad("partial_rotary_factor", "partial rotary embeddings are not supported");
}

// ACT2FN aliases folded onto the two activations Loom implements.
std::string canonical_act(const std::string& a) {
  if (a == "swish") return "silu";
  if (a == "gelu_new") return "gelu_pytorch_tanh";  // the same tanh formula (NewGELUActivation)
  return a;
}

void parse_activation(const Fields& f, ModelConfig* c) {
  const char* key = "hidden_act";
  std::string act = "silu";
  if (c->family == ModelFamily::kGemma || c->family == ModelFamily::kGemma2) {
    act = "gelu_pytorch_tanh";
    if (f.set("hidden_activation")) {
      key = "hidden_activation";
      act = *f.opt_string("hidden_activation");
    } else if (auto legacy = f.opt_string("hidden_act")) {
      // The original gemma-*b config.json says "gelu": transformers (PR #29402) runs the tanh approximation.
      act = *legacy == "gelu" ? "gelu_pytorch_tanh" : *legacy;
    }
  } else if (auto a = f.opt_string("hidden_act")) {
    act = *a;
  }
  c->hidden_act = canonical_act(act);
  if (c->hidden_act != "silu" && c->hidden_act != "gelu_pytorch_tanh")
    f.bad(key, "unsupported activation (supported: silu, gelu_pytorch_tanh)");
}

void parse_token_ids(const Fields& f, ModelConfig* c, std::optional<int64_t> bos, std::optional<int64_t> eos,
                     std::optional<int64_t> pad) {
  c->bos_token_id = f.has("bos_token_id") ? f.opt_int("bos_token_id") : bos;
  c->pad_token_id = f.has("pad_token_id") ? f.opt_int("pad_token_id") : pad;
  if (!f.has("eos_token_id")) {
    if (eos) c->eos_token_ids = {*eos};
  } else if (f.at("eos_token_id").is_array()) {
    for (const json& v : f.at("eos_token_id")) {
      if (!v.is_number_integer()) f.wrong("eos_token_id", "an integer or a list of integers");
      c->eos_token_ids.push_back(v.get<int64_t>());
    }
  } else if (auto id = f.opt_int("eos_token_id")) {
    c->eos_token_ids = {*id};
  }
  if (!c->eos_token_ids.empty()) c->eos_token_id = c->eos_token_ids.front();
}

// Sliding-window attention per family (see layer_is_sliding in config.h).
void parse_sliding(const Fields& f, ModelConfig* c) {
  const int64_t n = c->num_hidden_layers;
  c->layer_is_sliding.assign(static_cast<size_t>(n), false);
  const ModelFamily fam = c->family;
  if (fam == ModelFamily::kLlama || fam == ModelFamily::kGemma) return;
  if (fam == ModelFamily::kMistral) {  // (transformers ignores a mistral `layer_types`, with a warning)
    c->sliding_window = f.has("sliding_window") ? f.opt_int("sliding_window").value_or(0) : 4096;
    if (c->sliding_window < 0) f.bad("sliding_window", "must be >= 0 (or null for none)");
    c->layer_is_sliding.assign(static_cast<size_t>(n), c->sliding_window > 0);
    return;
  }
  std::vector<std::string> types;  // qwen2, qwen3, gemma2
  if (f.set("layer_types")) {
    const json& lt = f.at("layer_types");
    if (!lt.is_array()) f.wrong("layer_types", "a list of \"sliding_attention\" / \"full_attention\"");
    for (const json& v : lt) {
      if (!v.is_string() || (v != "sliding_attention" && v != "full_attention"))
        f.bad("layer_types", absl::StrCat("entry ", show(v), " is not \"sliding_attention\" or \"full_attention\""));
      types.push_back(v.get<std::string>());
    }
    if (static_cast<int64_t>(types.size()) != n)
      f.bad("layer_types", absl::StrCat("has ", types.size(), " entries for num_hidden_layers = ", n));
  }
  if (fam == ModelFamily::kQwen2 || fam == ModelFamily::kQwen3) {
    if (f.get_bool("use_sliding_window", false))
      f.bad("use_sliding_window", "sliding-window attention in Qwen models is not supported by Loom");
    for (const std::string& t : types)
      if (t == "sliding_attention")
        f.bad("layer_types", "sliding_attention layers in Qwen models are not supported by Loom");
    return;  // transformers drops sliding_window when use_sliding_window is false
  }
  c->sliding_window = f.has("sliding_window") ? f.opt_int("sliding_window").value_or(0) : 4096;  // gemma2
  if (c->sliding_window < 0) f.bad("sliding_window", "must be >= 0 (or null for none)");
  for (int64_t i = 0; i < n; ++i)
    c->layer_is_sliding[i] = c->sliding_window > 0 && (types.empty() ? i % 2 == 0 : types[i] == "sliding_attention");
}

ModelConfig parse(const json& j, const std::string& origin) {
  if (!j.is_object()) fail(absl::StrCat(origin, ": expected a JSON object, got a JSON ", j.type_name()));
  Fields f(j, origin, "");
  ModelConfig c;
  const auto type = f.opt_string("model_type");
  if (!type) f.missing("model_type", absl::StrCat("one of ", kSupportedTypes).c_str());
  auto family = family_from_model_type(*type);
  if (!family.ok())
    throw ConfigError{absl::InvalidArgumentError(absl::StrCat(origin, ": ", family.status().message()))};
  c.family = *family;
  c.model_type = *type;
  const ModelFamily fam = c.family;
  const bool gemma = fam == ModelFamily::kGemma || fam == ModelFamily::kGemma2;

  c.vocab_size = f.req_int("vocab_size", "the vocabulary size");
  c.hidden_size = f.req_int("hidden_size", "the model width");
  c.intermediate_size = f.req_int("intermediate_size", "the MLP width");
  c.num_hidden_layers = f.req_int("num_hidden_layers", "the number of decoder layers");
  c.num_attention_heads = f.req_int("num_attention_heads", "the number of query heads");
  for (const char* k : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"})
    if (f.req_int(k, "") <= 0) f.bad(k, "must be > 0");
  // Upper bounds far past any published model, so that a corrupt file fails here rather than in
  // an allocation sized by it (found by fuzz_config: 8888888888882 layers). Token ids are 32-bit.
  const struct {
    const char* key;
    int64_t max;
  } limits[] = {{"vocab_size", (int64_t{1} << 31) - 1}, {"hidden_size", int64_t{1} << 20},
                {"intermediate_size", int64_t{1} << 22}, {"num_hidden_layers", int64_t{1} << 16},
                {"num_attention_heads", int64_t{1} << 16}};
  for (const auto& l : limits)
    if (f.req_int(l.key, "") > l.max) f.bad(l.key, absl::StrCat("is ", f.req_int(l.key, ""), ", past any plausible model (at most ", l.max, ")"));

  // Absent or null: as many as the query heads (LlamaConfig's rule). The other classes' defaults
  // (mistral 8, qwen 32, gemma 16, gemma2 4) only fit their own default head counts, and every
  // published config.json of those families states the value.
  c.num_key_value_heads = f.get_int("num_key_value_heads", c.num_attention_heads);
  if (c.num_key_value_heads <= 0) f.bad("num_key_value_heads", "must be > 0");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail(absl::StrCat(origin, ": num_attention_heads (", c.num_attention_heads,
                      ") is not a multiple of num_key_value_heads (", c.num_key_value_heads,
                      "): grouped-query attention needs whole groups"));

  if (f.set("head_dim")) {
    c.head_dim = *f.opt_int("head_dim");
  } else if (fam == ModelFamily::kQwen3 && !f.has("head_dim")) {
    c.head_dim = 128;
  } else if (gemma && !f.has("head_dim")) {
    c.head_dim = 256;
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      fail(absl::StrCat(origin, ": hidden_size (", c.hidden_size, ") is not a multiple of num_attention_heads (",
                        c.num_attention_heads, ") and no head_dim is given"));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0)
    fail(absl::StrCat(origin, ": head_dim is ", c.head_dim, ", expected a positive even number (RoPE rotates pairs)"));

  int64_t max_pos = 2048;  // llama
  if (fam == ModelFamily::kMistral) max_pos = 4096 * 32;
  if (fam == ModelFamily::kQwen2 || fam == ModelFamily::kQwen3) max_pos = 32768;
  if (gemma) max_pos = 8192;
  c.max_position_embeddings = f.get_int("max_position_embeddings", max_pos);
  if (c.max_position_embeddings < 1) f.bad("max_position_embeddings", "must be >= 1");

  c.rms_norm_eps = f.get_double("rms_norm_eps", 1e-6);
  if (!(c.rms_norm_eps > 0)) f.bad("rms_norm_eps", "must be > 0");
  parse_rope(f, j, origin, &c);

  c.tie_word_embeddings = f.get_bool("tie_word_embeddings", gemma);
  switch (fam) {
    case ModelFamily::kQwen2:
      c.attention_bias = true;
      c.o_proj_bias = false;
      break;
    case ModelFamily::kMistral:
      c.attention_bias = c.o_proj_bias = false;
      break;
    default:
      c.attention_bias = c.o_proj_bias = f.get_bool("attention_bias", false);
  }
  c.mlp_bias = fam == ModelFamily::kLlama && f.get_bool("mlp_bias", false);
  parse_activation(f, &c);

  if (fam == ModelFamily::kGemma2) {
    auto cap = [&](const char* key, double dflt) {
      return static_cast<float>(f.has(key) ? f.opt_double(key).value_or(0) : dflt);
    };
    c.attn_logit_softcapping = cap("attn_logit_softcapping", 50.0);
    c.final_logit_softcapping = cap("final_logit_softcapping", 30.0);
    if (c.attn_logit_softcapping < 0) f.bad("attn_logit_softcapping", "must be >= 0 (or null for none)");
    if (c.final_logit_softcapping < 0) f.bad("final_logit_softcapping", "must be >= 0 (or null for none)");
    c.query_pre_attn_scalar = f.get_double("query_pre_attn_scalar", 256.0);
    if (!(c.query_pre_attn_scalar > 0)) f.bad("query_pre_attn_scalar", "must be > 0");
  }
  parse_sliding(f, &c);

  if (gemma)
    parse_token_ids(f, &c, 2, 1, 0);
  else if (fam == ModelFamily::kLlama || fam == ModelFamily::kMistral)
    parse_token_ids(f, &c, 1, 2, std::nullopt);
  else
    parse_token_ids(f, &c, std::nullopt, std::nullopt, std::nullopt);

  if (auto d = f.opt_string("dtype"))
    c.torch_dtype = *d;
  else if (auto td = f.opt_string("torch_dtype"))
    c.torch_dtype = *td;
  return c;
}

const char* rope_kind_name(RopeScaling::Kind k) {
  switch (k) {
    case RopeScaling::Kind::kDefault:
      return "default";
    case RopeScaling::Kind::kLinear:
      return "linear";
    case RopeScaling::Kind::kLlama3:
      return "llama3";
  }
  return "?";
}

}  // namespace

const char* model_type_name(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama:
      return "llama";
    case ModelFamily::kMistral:
      return "mistral";
    case ModelFamily::kQwen2:
      return "qwen2";
    case ModelFamily::kQwen3:
      return "qwen3";
    case ModelFamily::kGemma:
      return "gemma";
    case ModelFamily::kGemma2:
      return "gemma2";
  }
  return "?";
}

absl::StatusOr<ModelFamily> family_from_model_type(const std::string& model_type) {
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kMistral, ModelFamily::kQwen2, ModelFamily::kQwen3,
                        ModelFamily::kGemma, ModelFamily::kGemma2})
    if (model_type == model_type_name(f)) return f;
  return absl::InvalidArgumentError(
      absl::StrCat("model_type '", model_type, "' is not supported (supported: ", kSupportedTypes, ")"));
}

absl::StatusOr<ModelConfig> ModelConfig::from_json_text(const std::string& text, const std::string& origin) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(origin, ": not valid JSON"));
  try {
    return parse(j, origin);
  } catch (const ConfigError& e) {
    return e.status;
  } catch (const json::exception& e) {  // a type the checks above missed: still the user's file
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", e.what()));
  }
}

absl::StatusOr<ModelConfig> ModelConfig::load(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in || is_directory_path(path))
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", open_error_reason(path), " (is '", model_dir,
                                            "' a Hugging Face model folder?)"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return from_json_text(text.str(), path);
}

float ModelConfig::attention_scale() const {
  const double d = query_pre_attn_scalar > 0 ? query_pre_attn_scalar : static_cast<double>(head_dim);
  return static_cast<float>(1.0 / std::sqrt(d));
}

std::string ModelConfig::summary() const {
  std::string rope = absl::StrFormat("rope %s theta %g", rope_kind_name(rope_scaling.kind), rope_theta);
  if (rope_scaling.kind != RopeScaling::Kind::kDefault) absl::StrAppendFormat(&rope, " factor %g", rope_scaling.factor);
  int64_t sliding = 0;
  for (bool s : layer_is_sliding) sliding += s;
  std::string s = absl::StrFormat(
      "%s: %d layers, hidden %d, heads %d/%d x %d, mlp %d %s, vocab %d, %s, eps %g, max_pos %d, tied %s", model_type,
      num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size, hidden_act,
      vocab_size, rope, rms_norm_eps, max_position_embeddings, tie_word_embeddings ? "yes" : "no");
  if (attention_bias || o_proj_bias || mlp_bias)
    absl::StrAppendFormat(&s, ", bias qkv %d o %d mlp %d", int{attention_bias}, int{o_proj_bias}, int{mlp_bias});
  if (sliding_window > 0) absl::StrAppendFormat(&s, ", sliding %d on %d layers", sliding_window, sliding);
  if (attn_logit_softcapping > 0 || final_logit_softcapping > 0)
    absl::StrAppendFormat(&s, ", softcap attn %g final %g", attn_logit_softcapping, final_logit_softcapping);
  if (query_pre_attn_scalar > 0) absl::StrAppendFormat(&s, ", query_pre_attn_scalar %g", query_pre_attn_scalar);
  if (!torch_dtype.empty()) absl::StrAppend(&s, ", ", torch_dtype);
  return s;
}

}  // namespace loom
