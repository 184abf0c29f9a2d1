// ConfigFields (models/config_fields.h): typed access to config.json with errors naming the field.
#include "models/config_fields.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "models/config.h"

namespace loom {

using nlohmann::json;

void config_fail(std::string msg) { throw ConfigError{absl::InvalidArgumentError(std::move(msg))}; }

std::string show_json(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

void ConfigFields::wrong(const char* key, const char* expected) const {
  config_fail(absl::StrCat(where_, ": field '", prefix_, key, "' is ", show_json(obj_.at(key)), " (a JSON ",
                           obj_.at(key).type_name(), "), expected ", expected));
}
void ConfigFields::missing(const char* key, const char* what) const {
  config_fail(absl::StrCat(where_, ": missing required field '", prefix_, key, "' (", what, ")"));
}
void ConfigFields::bad(const char* key, const std::string& why) const {
  config_fail(absl::StrCat(where_, ": field '", prefix_, key, "' = ", show_json(obj_.at(key)), ": ", why));
}

std::optional<int64_t> ConfigFields::opt_int(const char* key) const {
  if (!set(key)) return std::nullopt;
  const json& v = obj_.at(key);
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) wrong(key, "an integer that fits in 64 bits");
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  wrong(key, "an integer");
}
int64_t ConfigFields::req_int(const char* key, const char* what) const {
  if (!set(key)) missing(key, what);
  return *opt_int(key);
}
std::optional<double> ConfigFields::opt_double(const char* key) const {
  if (!set(key)) return std::nullopt;
  const json& v = obj_.at(key);
  if (!v.is_number()) wrong(key, "a number");
  return v.get<double>();
}
double ConfigFields::req_double(const char* key, const char* what) const {
  if (!set(key)) missing(key, what);
  return *opt_double(key);
}
bool ConfigFields::get_bool(const char* key, bool dflt) const {
  if (!set(key)) return dflt;
  if (!obj_.at(key).is_boolean()) wrong(key, "true or false");
  return obj_.at(key).get<bool>();
}
std::optional<std::string> ConfigFields::opt_string(const char* key) const {
  if (!set(key)) return std::nullopt;
  if (!obj_.at(key).is_string()) wrong(key, "a string");
  return obj_.at(key).get<std::string>();
}

void set_activation(const ConfigFields& f, const char* key, const std::string& act, ModelConfig& c) {
  c.hidden_act = act == "swish" ? "silu" : act == "gelu_new" ? "gelu_pytorch_tanh" : act;  // NewGELUActivation: the same tanh formula
  if (c.hidden_act != "silu" && c.hidden_act != "gelu_pytorch_tanh")
    f.bad(key, "unsupported activation (supported: silu, gelu_pytorch_tanh)");
}

void read_hidden_act(const ConfigFields& f, ModelConfig& c) {
  set_activation(f, "hidden_act", f.opt_string("hidden_act").value_or("silu"), c);
}

std::vector<std::string> read_layer_types(const ConfigFields& f, int64_t n) {
  std::vector<std::string> types;
  if (!f.set("layer_types")) return types;
  const json& lt = f.at("layer_types");
  if (!lt.is_array()) f.wrong("layer_types", "a list of \"sliding_attention\" / \"full_attention\"");
  for (const json& v : lt) {
    if (!v.is_string() || (v != "sliding_attention" && v != "full_attention"))
      f.bad("layer_types", absl::StrCat("entry ", show_json(v), " is not \"sliding_attention\" or \"full_attention\""));
    types.push_back(v.get<std::string>());
  }
  if (static_cast<int64_t>(types.size()) != n)
    f.bad("layer_types", absl::StrCat("has ", types.size(), " entries for num_hidden_layers = ", n));
  return types;
}

int64_t read_sliding_window(const ConfigFields& f, int64_t dflt) {
  const int64_t w = f.has("sliding_window") ? f.opt_int("sliding_window").value_or(0) : dflt;
  if (w < 0) f.bad("sliding_window", "must be >= 0 (or null for none)");
  return w;
}

float read_softcap(const ConfigFields& f, const char* key, double dflt) {
  const float cap = static_cast<float>(f.has(key) ? f.opt_double(key).value_or(0) : dflt);
  if (cap < 0) f.bad(key, "must be >= 0 (or null for none)");
  return cap;
}

}  // namespace loom
