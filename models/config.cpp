// ModelConfig parsing: the keys every family shares (sizes, heads, RoPE in its 4.x `rope_theta` +
// `rope_scaling` and 5.x `rope_parameters` forms, token ids), the family's defaults and its own keys
// through its spec (models/families/), and validation of what Loom implements.
#include "models/config.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "engine/io_error.h"
#include "models/config_fields.h"
#include "models/family.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

using nlohmann::json;

constexpr const char* kSupportedRope = "default, linear, llama3, longrope";

// A list of positive numbers (LongRoPE's short_factor / long_factor).
std::vector<double> read_factor_list(const ConfigFields& f, const char* key) {
  if (!f.set(key)) f.missing(key, "LongRoPE needs both short_factor and long_factor");
  const json& v = f.at(key);
  if (!v.is_array() || v.empty()) f.wrong(key, "a non-empty list of numbers");
  std::vector<double> out;
  for (const json& e : v) {
    if (!e.is_number()) f.wrong(key, "a non-empty list of numbers");
    const double d = e.get<double>();
    if (!(d > 0) || !std::isfinite(d)) f.bad(key, "every factor must be a finite number > 0");
    out.push_back(d);
  }
  return out;
}

// The scaling dict of either version (4.x `rope_scaling` or 5.x `rope_parameters`), whose object
// is `f`; `name` is the key it came from; `top` is config.json's top level (4.x Phi-3 keeps
// original_max_position_embeddings there).
RopeScaling parse_rope_scaling(const ConfigFields& f, const std::string& name, const ConfigFields& top,
                               int64_t max_position_embeddings) {
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
      config_fail(absl::StrCat(f.where(), ": ", name, " has low_freq_factor ", s.low_freq_factor, " and high_freq_factor ",
                        s.high_freq_factor, ": llama3 RoPE needs 0 < low_freq_factor < high_freq_factor"));
    return s;
  }
  if (type == "longrope" || type == "su") {  // "su": the name Phi-3's first configs used
    s.kind = RopeScaling::Kind::kLongRope;
    s.short_factor = read_factor_list(f, "short_factor");
    s.long_factor = read_factor_list(f, "long_factor");
    if (s.short_factor.size() != s.long_factor.size())
      config_fail(absl::StrCat(f.where(), ": ", name, " has ", s.short_factor.size(), " short_factor and ",
                               s.long_factor.size(), " long_factor entries; LongRoPE needs one of each per frequency"));
    // transformers: the pretrained length from the dict (5.x) or the top level (4.x), else
    // max_position_embeddings; the default attention factor from max_position_embeddings / it.
    double original = static_cast<double>(max_position_embeddings);
    if (f.set("original_max_position_embeddings"))
      original = f.req_double("original_max_position_embeddings", "");
    else if (top.set("original_max_position_embeddings"))
      original = top.req_double("original_max_position_embeddings", "");
    if (!(original >= 1)) f.bad("original_max_position_embeddings", "must be >= 1");
    s.original_max_position_embeddings = original;
    s.factor = f.set("factor") ? f.req_double("factor", "") : static_cast<double>(max_position_embeddings) / original;
    if (!(s.factor > 0)) f.bad("factor", "must be > 0");
    if (f.set("attention_factor")) {
      s.attention_factor = f.req_double("attention_factor", "");
      if (!(s.attention_factor > 0)) f.bad("attention_factor", "must be > 0");
    } else {
      s.attention_factor = s.factor <= 1 ? 1.0 : std::sqrt(1 + std::log(s.factor) / std::log(original));
    }
    return s;
  }
  config_fail(absl::StrCat(f.where(), ": ", name, " has rope_type '", type,
                    "', which Loom does not support (supported: ", kSupportedRope, ")"));
}

// One RoPE dict of `rope_parameters` (the object `f`, key `name`): its base and scaling.
RopeParams parse_rope_dict(const ConfigFields& f, const std::string& name, double theta, const ConfigFields& top,
                           int64_t max_position_embeddings) {
  RopeParams r;
  r.theta = f.get_double("rope_theta", theta);
  r.scaling = parse_rope_scaling(f, name, top, max_position_embeddings);
  if (f.set("partial_rotary_factor")) r.partial_rotary_factor = f.get_double("partial_rotary_factor", 1);
  return r;
}

// partial_rotary_factor (top level in 4.x, or in the RoPE dict) against the family and head_dim, and
// LongRoPE's factor lists against the rotated frequencies.
void check_rotary(const ConfigFields& top, const std::string& origin, const ModelConfig& c, const RopeParams& r) {
  if (r.partial_rotary_factor != 1) {
    if (!c.family->partial_rotary)
      top.bad("partial_rotary_factor", absl::StrCat("partial rotary embeddings are not part of ", c.model_type, " models"));
    if (!(r.partial_rotary_factor > 0 && r.partial_rotary_factor <= 1))
      top.bad("partial_rotary_factor", "must be in (0, 1]");
  }
  const int64_t dim = r.rotary_dim(c.head_dim);
  if (dim < 2 || dim % 2 != 0)
    config_fail(absl::StrCat(origin, ": partial_rotary_factor ", r.partial_rotary_factor, " of head_dim ", c.head_dim,
                             " rotates ", dim, " dims; RoPE needs a positive even number"));
  if (r.scaling.kind == RopeScaling::Kind::kLongRope && static_cast<int64_t>(r.scaling.short_factor.size()) != dim / 2)
    config_fail(absl::StrCat(origin, ": LongRoPE has ", r.scaling.short_factor.size(), " factors per list, but ", dim,
                             " rotated dims need ", dim / 2));
}

// Fills rope and rope_sliding from either form. 5.x `rope_parameters` wins when both appear
// (transformers 5 writes only it; 4.x files have only the top-level keys). A family with RoPE per
// layer type may hold one dict per type there ({"full_attention": {...}, "sliding_attention": {...}}).
void parse_rope(const ConfigFields& top, const json& j, const std::string& origin, ModelConfig* c) {
  c->rope.theta = top.get_double("rope_theta", c->family->default_rope_theta);
  if (top.set("rope_parameters")) {
    const json& rp = j.at("rope_parameters");
    if (!rp.is_object())
      top.wrong("rope_parameters", "an object such as {\"rope_type\": \"default\", \"rope_theta\": 10000}");
    bool per_type = false;
    for (const auto& [k, v] : rp.items()) {
      if (!v.is_object()) continue;
      per_type = true;
      if (!c->family->rope_per_layer_type)
        config_fail(absl::StrCat(origin, ": rope_parameters holds a per-layer-type dict ('", k,
                                 "': {...}, as Gemma 3 writes); Loom supports one RoPE for all layers of ", c->model_type,
                                 " models"));
      if (k != "full_attention" && k != "sliding_attention")
        config_fail(absl::StrCat(origin, ": rope_parameters has a dict for '", k,
                                 "', expected the layer types full_attention and sliding_attention"));
    }
    if (per_type) {
      for (const char* k : {"full_attention", "sliding_attention"})
        if (!rp.contains(k) || !rp.at(k).is_object())
          config_fail(absl::StrCat(origin, ": rope_parameters has dicts per layer type but none for '", k, "'"));
      const double theta = c->rope.theta;
      c->rope = parse_rope_dict(ConfigFields(rp.at("full_attention"), origin, "rope_parameters.full_attention."),
                                "rope_parameters.full_attention", theta, top, c->max_position_embeddings);
      c->rope_sliding = parse_rope_dict(ConfigFields(rp.at("sliding_attention"), origin, "rope_parameters.sliding_attention."),
                                        "rope_parameters.sliding_attention", theta, top, c->max_position_embeddings);
    } else {
      c->rope = parse_rope_dict(ConfigFields(rp, origin, "rope_parameters."), "rope_parameters", c->rope.theta, top,
                                c->max_position_embeddings);
      c->rope_sliding = c->rope;
    }
  } else {
    if (top.set("rope_scaling")) {
      const json& rs = j.at("rope_scaling");
      if (!rs.is_object()) top.wrong("rope_scaling", "an object such as {\"rope_type\": \"llama3\", \"factor\": 8, ...}");
      c->rope.scaling =
          parse_rope_scaling(ConfigFields(rs, origin, "rope_scaling."), "rope_scaling", top, c->max_position_embeddings);
    }
    c->rope_sliding = c->rope;
  }
  if (!(c->rope.theta > 0)) config_fail(absl::StrCat(origin, ": rope_theta is ", c->rope.theta, ", expected > 0"));
  if (!(c->rope_sliding.theta > 0))
    config_fail(absl::StrCat(origin, ": the sliding layers' rope_theta is ", c->rope_sliding.theta, ", expected > 0"));
  // 4.x keeps partial_rotary_factor at the top level (a dict's own value wins).
  if (top.set("partial_rotary_factor")) {
    const double p = top.get_double("partial_rotary_factor", 1);
    for (RopeParams* r : {&c->rope, &c->rope_sliding})
      if (r->partial_rotary_factor == 1) r->partial_rotary_factor = p;
  }
  check_rotary(top, origin, *c, c->rope);
  check_rotary(top, origin, *c, c->rope_sliding);
}

void parse_token_ids(const ConfigFields& f, ModelConfig* c, std::optional<int64_t> bos, std::optional<int64_t> eos,
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

ModelConfig parse(const json& j, const std::string& origin) {
  if (!j.is_object()) config_fail(absl::StrCat(origin, ": expected a JSON object, got a JSON ", j.type_name()));
  ConfigFields f(j, origin, "");
  ModelConfig c;
  const auto type = f.opt_string("model_type");
  if (!type)
    f.missing("model_type", absl::StrCat("one of ", family_names([](const FamilySpec&) { return true; })).c_str());
  auto family = family_from_model_type(*type);
  if (!family.ok())
    throw ConfigError{absl::InvalidArgumentError(absl::StrCat(origin, ": ", family.status().message()))};
  const FamilySpec& fam = **family;
  if (!fam.text_config.empty()) {  // a multimodal folder: its language model's keys
    if (j.contains(fam.text_config) && !j.at(fam.text_config).is_object() && !j.at(fam.text_config).is_null())
      f.wrong(fam.text_config.c_str(), "an object (the language model's config)");
    ModelConfig text = parse(ModelConfig::language_model_json(j, fam), origin + " " + fam.text_config);
    text.family = &fam;
    text.model_type = *type;
    return text;
  }
  c.family = &fam;
  c.model_type = *type;

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

  c.num_key_value_heads = f.get_int("num_key_value_heads", c.num_attention_heads);
  if (c.num_key_value_heads <= 0) f.bad("num_key_value_heads", "must be > 0");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    config_fail(absl::StrCat(origin, ": num_attention_heads (", c.num_attention_heads,
                             ") is not a multiple of num_key_value_heads (", c.num_key_value_heads,
                             "): grouped-query attention needs whole groups"));

  if (f.set("head_dim")) {
    c.head_dim = *f.opt_int("head_dim");
  } else if (fam.default_head_dim > 0 && !f.has("head_dim")) {
    c.head_dim = fam.default_head_dim;
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      config_fail(absl::StrCat(origin, ": hidden_size (", c.hidden_size, ") is not a multiple of num_attention_heads (",
                               c.num_attention_heads, ") and no head_dim is given"));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0)
    config_fail(absl::StrCat(origin, ": head_dim is ", c.head_dim, ", expected a positive even number (RoPE rotates pairs)"));

  c.max_position_embeddings = f.get_int("max_position_embeddings", fam.default_max_position_embeddings);
  if (c.max_position_embeddings < 1) f.bad("max_position_embeddings", "must be >= 1");

  c.rms_norm_eps = f.get_double("rms_norm_eps", 1e-6);
  if (!(c.rms_norm_eps > 0)) f.bad("rms_norm_eps", "must be > 0");
  parse_rope(f, j, origin, &c);

  c.tie_word_embeddings = f.get_bool("tie_word_embeddings", fam.default_tie_word_embeddings);
  c.layer_is_sliding.assign(static_cast<size_t>(c.num_hidden_layers), false);
  fam.parse(f, c);  // biases, activation, soft-caps, windows
  parse_token_ids(f, &c, fam.default_bos, fam.default_eos, fam.default_pad);

  if (auto d = f.opt_string("dtype"))
    c.torch_dtype = *d;
  else if (auto td = f.opt_string("torch_dtype"))
    c.torch_dtype = *td;
  return c;
}

}  // namespace

json ModelConfig::language_model_json(const json& j, const FamilySpec& fam) {
  if (fam.text_config.empty() || !j.is_object()) return j;
  json t = fam.text_config_defaults.is_object() ? fam.text_config_defaults : json::object();
  if (j.contains(fam.text_config) && j.at(fam.text_config).is_object()) t.update(j.at(fam.text_config));
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype", "tie_word_embeddings"})
    if (j.contains(k) && !t.contains(k)) t[k] = j.at(k);
  t["model_type"] = fam.text_model_type;
  t["architectures"] = json::array({fam.text_architecture});
  return t;
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
  auto show_rope = [](const RopeParams& r) {
    std::string s = absl::StrFormat("%s theta %g", rope_kind_name(r.scaling.kind), r.theta);
    if (r.scaling.kind != RopeScaling::Kind::kDefault) absl::StrAppendFormat(&s, " factor %g", r.scaling.factor);
    return s;
  };
  std::string rope = "rope " + show_rope(this->rope);
  if (!(rope_sliding == this->rope)) absl::StrAppend(&rope, ", sliding layers' rope ", show_rope(rope_sliding));
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
  if (moe.experts > 0) {
    int64_t moe_layers = 0;
    for (bool m : moe.layer_is_moe) moe_layers += m;
    absl::StrAppendFormat(&s, ", moe %d experts top %d width %d%s on %d layers", moe.experts, moe.experts_per_token,
                          moe.expert_intermediate, moe.renormalize ? " renormalised" : "", moe_layers);
  }
  if (!torch_dtype.empty()) absl::StrAppend(&s, ", ", torch_dtype);
  return s;
}

}  // namespace loom
