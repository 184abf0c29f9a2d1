// Typed reading of config.json for ModelConfig and the family specs: every accessor checks the JSON
// type, and every error names the file and the dotted field. Errors are thrown as ConfigError and
// turned into the returned absl::Status by ModelConfig::from_json_text (nothing escapes models/).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace loom {
struct ModelConfig;

struct ConfigError {
  absl::Status status;
};
[[noreturn]] void config_fail(std::string msg);  // throws ConfigError{InvalidArgument(msg)}
std::string show_json(const nlohmann::json& v);  // compact, at most 60 characters

// One JSON object; `where` is the file ("config.json") and `prefix` the dotted path of the object
// ("" or "rope_scaling.") for messages.
class ConfigFields {
 public:
  ConfigFields(const nlohmann::json& obj, std::string where, std::string prefix)
      : obj_(obj), where_(std::move(where)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return obj_.contains(key); }
  bool set(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }  // present, not null
  const nlohmann::json& at(const char* key) const { return obj_.at(key); }

  [[noreturn]] void wrong(const char* key, const char* expected) const;  // "... is X (a JSON t), expected ..."
  [[noreturn]] void missing(const char* key, const char* what) const;
  [[noreturn]] void bad(const char* key, const std::string& why) const;  // "field 'k' = X: why"

  std::optional<int64_t> opt_int(const char* key) const;
  int64_t req_int(const char* key, const char* what) const;
  int64_t get_int(const char* key, int64_t dflt) const { return opt_int(key).value_or(dflt); }
  std::optional<double> opt_double(const char* key) const;
  double get_double(const char* key, double dflt) const { return opt_double(key).value_or(dflt); }
  double req_double(const char* key, const char* what) const;
  bool get_bool(const char* key, bool dflt) const;
  std::optional<std::string> opt_string(const char* key) const;

  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& obj_;
  std::string where_;
  std::string prefix_;
};

// Shared readers for the families' parse hooks.

// `hidden_act` ("silu" default; "swish" and "gelu_new" folded onto silu and gelu_pytorch_tanh as
// ACT2FN aliases them); rejects what Loom does not implement.
void read_hidden_act(const ConfigFields& f, ModelConfig& c);
// Checks and sets an activation read from `key` (for families with their own rule).
void set_activation(const ConfigFields& f, const char* key, const std::string& act, ModelConfig& c);
// `layer_types`: num_hidden_layers entries of "sliding_attention" / "full_attention"; [] when absent.
std::vector<std::string> read_layer_types(const ConfigFields& f, int64_t num_layers);
// `sliding_window` (absent: `dflt`; null: 0 = none); must be >= 0.
int64_t read_sliding_window(const ConfigFields& f, int64_t dflt);
// A soft-cap key (absent: `dflt`; null: 0 = off); must be >= 0.
float read_softcap(const ConfigFields& f, const char* key, double dflt);

}  // namespace loom
