// LoRA injection, PEFT adapter files, merging and saving merged checkpoints (see lora.h).
#include "models/lora.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string_view>
#include <set>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/json_file.h"
#include "engine/splitmix64.h"
#include "engine/tensor_io.h"
#include "models/finite_check.h"
#include "models/gguf_model.h"
#include "models/lora_experts.h"
#include "models/weight_map.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace fs = std::filesystem;
namespace {

const char* kPeftPrefix = "base_model.model.";

bool matches(const std::string& module, const LoraConfig& c, bool is_head) {
  for (const std::string& t : c.target_modules) {
    if (t == "all-linear") {
      if (!is_head) return true;
      continue;
    }
    if (module == t || (module.size() > t.size() && module.ends_with("." + t))) return true;
  }
  return false;
}

// Writes text to path through a temporary name and a rename.
absl::Status write_text_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp));
    f << text;
    f.flush();
    if (!f) return absl::DataLossError(absl::StrCat("failed writing ", tmp));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ", ec.message()));
  return absl::OkStatus();
}

absl::Status ensure_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create folder ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

void attach(Linear& l, Tensor a, Tensor b, const LoraConfig& c) {
  auto lora = std::make_unique<LoraAdapter>();
  lora->A = ag::Variable(std::move(a), true);
  lora->B = ag::Variable(std::move(b), true);
  lora->scale = c.scale_for(l.name);
  lora->dropout = c.dropout;
  l.lora = std::move(lora);
}

absl::Status check_config(const LoraConfig& c) {
  if (c.r <= 0) return absl::InvalidArgumentError(absl::StrCat("LoRA rank r must be positive, got ", c.r));
  if (!(c.alpha > 0.f)) return absl::InvalidArgumentError(absl::StrCat("lora_alpha must be positive, got ", c.alpha));
  if (!(c.dropout >= 0.f && c.dropout < 1.f))
    return absl::InvalidArgumentError(absl::StrCat("lora_dropout must be in [0, 1), got ", c.dropout));
  if (c.target_modules.empty() && c.target_parameters.empty())
    return absl::InvalidArgumentError("LoRA target_modules (and target_parameters) are empty");
  return absl::OkStatus();
}

}  // namespace

float LoraConfig::scale() const {
  return use_rslora ? alpha / std::sqrt(static_cast<float>(r)) : alpha / static_cast<float>(r);
}

namespace {
// A pattern key of rank_pattern / alpha_pattern as PEFT writes them: module names with "\." for a dot,
// "." for any character and ".*" for any run of them. Other regular-expression syntax is refused when
// the config is read (a backtracking regex engine on a downloaded file's pattern can take forever:
// fuzz_adapter_config found one), so these are matched by a linear wildcard walk instead.
struct PatternToken {
  enum Kind { kChar, kAny, kStar } kind;
  char c = 0;
};

std::optional<std::vector<PatternToken>> tokenize_pattern(const std::string& key) {
  std::vector<PatternToken> out;
  for (size_t i = 0; i < key.size(); ++i) {
    const char ch = key[i];
    if (ch == '\\') {
      if (i + 1 >= key.size() || key[i + 1] != '.') return std::nullopt;
      out.push_back({PatternToken::kChar, '.'});
      ++i;
    } else if (ch == '.') {
      if (i + 1 < key.size() && key[i + 1] == '*') {
        out.push_back({PatternToken::kStar});
        ++i;
      } else {
        out.push_back({PatternToken::kAny});
      }
    } else if (std::string_view("[](){}|+?^$*").find(ch) != std::string_view::npos) {
      return std::nullopt;
    } else {
      out.push_back({PatternToken::kChar, ch});
    }
  }
  return out;
}

// Whole-string match of s against the tokens (the classic wildcard walk: linear with one backtrack point).
bool wildcard_match(std::string_view s, const std::vector<PatternToken>& p) {
  size_t i = 0, j = 0, star = std::string::npos, mark = 0;
  while (i < s.size()) {
    if (j < p.size() && p[j].kind != PatternToken::kStar && (p[j].kind == PatternToken::kAny || p[j].c == s[i])) {
      ++i, ++j;
    } else if (j < p.size() && p[j].kind == PatternToken::kStar) {
      star = j++, mark = i;
    } else if (star != std::string::npos) {
      j = star + 1, i = ++mark;
    } else {
      return false;
    }
  }
  while (j < p.size() && p[j].kind == PatternToken::kStar) ++j;
  return j == p.size();
}

// PEFT's get_pattern_key: re.match(rf"(.*\.)?({key})$", name), the first key in order that matches.
template <class V>
const V* pattern_value(const std::vector<std::pair<std::string, V>>& patterns, const std::string& name) {
  for (const auto& [key, v] : patterns) {
    const auto tokens = tokenize_pattern(key);
    if (!tokens) continue;  // refused when read; not reached
    for (size_t start = 0; start <= name.size(); start = name.find('.', start) + 1) {
      if (wildcard_match(std::string_view(name).substr(start), *tokens)) return &v;
      if (name.find('.', start) == std::string::npos) break;
    }
  }
  return nullptr;
}
}  // namespace

int64_t LoraConfig::rank_for(const std::string& name) const {
  const int64_t* v = pattern_value(rank_pattern, name);
  return v ? *v : r;
}

float LoraConfig::scale_for(const std::string& name) const {
  const float* a = pattern_value(alpha_pattern, name);
  const float rank = static_cast<float>(rank_for(name)), al = a ? *a : alpha;
  return use_rslora ? al / std::sqrt(rank) : al / rank;
}

std::string peft_tensor_name(const std::string& module, bool lora_a) {
  return absl::StrCat(kPeftPrefix, module, lora_a ? ".lora_A.weight" : ".lora_B.weight");
}

namespace {
uint64_t mix(uint64_t x) { return splitmix64(&x); }  // one splitmix64 step from x: a 64-bit hash
}  // namespace

void seed_lora_dropout(CausalLM& model, uint64_t seed) {
  uint64_t index = 0;
  for (Linear* l : model.linears())
    if (l->lora) l->lora->dropout_seed = mix(seed ^ mix(++index)), l->lora->dropout_offset = 0;
}

absl::Status add_lora(CausalLM& model, const LoraConfig& config, uint64_t seed) {
  if (absl::Status s = check_config(config); !s.ok()) return s;
  // A rank past a module's larger side adds nothing a rank of min(in, out) could not, and is
  // almost always a typo: refused before any adapter is allocated.
  for (Linear* l : model.linears())
    if (matches(l->name, config, l->name == "lm_head") &&
        config.rank_for(l->name) > std::max(l->in_features(), l->out_features()))
      return absl::InvalidArgumentError(absl::StrCat("LoRA r ", config.rank_for(l->name), " exceeds both sides of ", l->name, " (in ",
                                                     l->in_features(), ", out ", l->out_features(),
                                                     "): a rank past min(in, out) adds no capacity"));
  int matched = 0;
  uint64_t index = 0;
  for (Linear* l : model.linears()) {
    ++index;
    if (!matches(l->name, config, l->name == "lm_head")) continue;
    ++matched;
    const int64_t in = l->in_features(), out = l->out_features();
    const DType adapter = model.precision().adapter;  // f32 next to a bf16 model, as PEFT
    const int64_t r = config.rank_for(l->name);
    Tensor a = Tensor::empty({r, in}, adapter, model.device_of(l->name));
    const float bound = 1.f / std::sqrt(static_cast<float>(in));
    ops::uniform_(a, seed, index << 32, -bound, bound);
    attach(*l, a, Tensor::zeros({out, r}, adapter, model.device_of(l->name)), config);
  }
  if (absl::Status s = detail::add_expert_lora(model, config, seed, &matched); !s.ok()) return s;
  if (matched == 0) {
    std::string names;
    for (const auto& t : config.target_modules) absl::StrAppend(&names, names.empty() ? "" : ", ", t);
    for (const auto& t : config.target_parameters) absl::StrAppend(&names, names.empty() ? "" : ", ", t);
    std::set<std::string> leaves;  // the model's own linear layers, by their short names
    std::string have;
    for (const Linear* l : std::as_const(model).linears())
      if (l->name != "lm_head" && leaves.insert(l->name.substr(l->name.rfind('.') + 1)).second)
        absl::StrAppend(&have, have.empty() ? "" : ", ", l->name.substr(l->name.rfind('.') + 1));
    if (!model.expert_linears().empty()) absl::StrAppend(&have, "; its experts: mlp.experts.gate_up_proj, mlp.experts.down_proj");
    return absl::InvalidArgumentError(absl::StrCat("LoRA target_modules [", names, "] match no module of this ",
                                                   model.config().model_type, " model (its linear layers are ", have,
                                                   ")"));
  }
  seed_lora_dropout(model, seed);
  return absl::OkStatus();
}

AdaptersOff::AdaptersOff(CausalLM& model) {
  for (Linear* l : model.linears())
    if (l->lora && l->lora->enabled) {
      l->lora->enabled = false;
      off_.push_back(l->lora.get());
    }
  for (ExpertLinear* p : model.expert_linears())
    if (p->lora && p->lora->enabled) {
      p->lora->enabled = false;
      off_.push_back(p->lora.get());
    }
}

AdaptersOff::~AdaptersOff() {
  for (LoraAdapter* a : off_) a->enabled = true;
}

std::vector<std::pair<std::string, ag::Variable*>> lora_parameters(CausalLM& model) {
  std::vector<std::pair<std::string, ag::Variable*>> out;
  for (Linear* l : model.linears()) {
    if (!l->lora) continue;
    out.emplace_back(peft_tensor_name(l->name, true), &l->lora->A);
    out.emplace_back(peft_tensor_name(l->name, false), &l->lora->B);
  }
  for (ExpertLinear* p : model.expert_linears()) {
    if (!p->lora) continue;
    const std::string module = detail::peft_expert_module(model, *p);
    out.emplace_back(peft_tensor_name(module, true), &p->lora->A);
    out.emplace_back(peft_tensor_name(module, false), &p->lora->B);
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> peft_adapter_tensors(const CausalLM& model, bool grads) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Linear* l : model.linears()) {
    if (!l->lora) continue;
    out.emplace_back(peft_tensor_name(l->name, true), grads ? l->lora->A.grad() : l->lora->A.value());
    out.emplace_back(peft_tensor_name(l->name, false), grads ? l->lora->B.grad() : l->lora->B.value());
  }
  for (auto& t : detail::peft_expert_tensors(model, grads)) out.push_back(std::move(t));
  return out;
}

absl::Status save_adapter(const CausalLM& model, const LoraConfig& config, const std::string& dir) {
  if (absl::Status s = ensure_dir(dir); !s.ok()) return s;
  std::vector<std::pair<std::string, Tensor>> tensors = peft_adapter_tensors(model);
  std::set<std::string> short_targets, full_targets;
  for (const Linear* l : model.linears()) {
    if (!l->lora) continue;
    short_targets.insert(l->name.substr(l->name.rfind('.') + 1));
    full_targets.insert(l->name);
  }
  // PEFT's usual short names ("q_proj") when they select exactly the adapted modules, else the
  // full module names (an adapter on some layers only).
  LoraConfig short_cfg;
  short_cfg.target_modules.assign(short_targets.begin(), short_targets.end());
  for (const Linear* l : model.linears())
    if (matches(l->name, short_cfg, l->name == "lm_head") != (l->lora != nullptr)) {
      short_targets = full_targets;
      break;
    }
  // Expert projections likewise: PEFT's "mlp.experts.gate_up_proj" form when it selects exactly the
  // adapted ones, else their full names.
  std::set<std::string> short_params, full_params;
  for (const ExpertLinear* p : model.expert_linears())
    if (p->lora) short_params.insert(p->name.substr(p->name.rfind(".mlp.experts.") + 1)), full_params.insert(p->name);
  LoraConfig short_experts;
  short_experts.target_parameters.assign(short_params.begin(), short_params.end());
  for (const ExpertLinear* p : model.expert_linears())
    if (detail::expert_targeted(p->name, short_experts) != (p->lora != nullptr)) {
      short_params = full_params;
      break;
    }
  if (tensors.empty()) return absl::FailedPreconditionError("save_adapter: the model has no LoRA adapters");
  const std::string weights_path = (fs::path(dir) / "adapter_model.safetensors").string();
  if (absl::Status s = check_finite_to_save(tensors, weights_path); !s.ok()) return s;
  nlohmann::json j = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", model.source_dir()},
      {"r", config.r},
      {"lora_alpha", config.alpha},
      {"lora_dropout", config.dropout},
      {"use_rslora", config.use_rslora},
      {"target_modules", short_targets.empty() ? nlohmann::json() : nlohmann::json(std::vector<std::string>(
                                                                         short_targets.begin(), short_targets.end()))},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
      {"use_dora", false},
      {"revision", nullptr},
  };
  for (const auto& [k, v] : config.rank_pattern) j["rank_pattern"][k] = v;
  for (const auto& [k, v] : config.alpha_pattern) j["alpha_pattern"][k] = v;
  if (!short_params.empty()) j["target_parameters"] = std::vector<std::string>(short_params.begin(), short_params.end());
  if (absl::Status s = save_tensors(weights_path, tensors, DType::f32, {{"format", "pt"}});
      !s.ok())
    return s;
  return write_text_atomic((fs::path(dir) / "adapter_config.json").string(), j.dump(2) + "\n");
}

absl::StatusOr<LoraConfig> load_adapter(CausalLM& model, const std::string& dir) {
  const std::string cfg_path = (fs::path(dir) / "adapter_config.json").string();
  std::error_code ec;
  if (fs::is_directory(cfg_path, ec)) return absl::InvalidArgumentError(absl::StrCat(cfg_path, ": is a folder, not a file"));
  std::ifstream f(cfg_path);
  if (!f) return absl::NotFoundError(absl::StrCat("no adapter_config.json in ", dir));
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(cfg_path, ": not a JSON object"));
  auto bad = [&](const std::string& what) { return absl::InvalidArgumentError(absl::StrCat(cfg_path, ": ", what)); };
  LoraConfig c;
  // Every field read under the try: value() of a key holding another JSON type throws (found by
  // fuzz_adapter_config: "peft_type": null ended the program).
  try {
    if (!j.contains("peft_type") || !j["peft_type"].is_string() || j["peft_type"] != "LORA")
      return bad(absl::StrCat("peft_type must be \"LORA\", got ", j.value("peft_type", nlohmann::json()).dump()));
    const bool has_parameters = j.contains("target_parameters") && !j["target_parameters"].is_null();
    if (!j.contains("r")) return bad("missing field \"r\"");
    if (!has_parameters && !j.contains("target_modules")) return bad("missing field \"target_modules\"");
    // Numbers checked before they are converted: a float past int64 or float range is undefined
    // behaviour to cast (found by fuzz_adapter_config: "r": 8.4e47).
    const nlohmann::json& r = j.at("r");
    if (!r.is_number_integer() || r.get<int64_t>() < 1 || r.get<int64_t>() > 65536)
      return bad(absl::StrCat("r must be an integer from 1 to 65536, got ", r.dump()));
    c.r = r.get<int64_t>();
    auto real = [&](const char* key, float dflt, float* out) -> absl::Status {
      if (!j.contains(key) || j[key].is_null()) {
        *out = dflt;
        return absl::OkStatus();
      }
      const nlohmann::json& v = j[key];
      if (!v.is_number() || !std::isfinite(v.get<double>()) || std::fabs(v.get<double>()) > 1e30)
        return bad(absl::StrCat(key, " must be a finite number, got ", v.dump()));
      *out = static_cast<float>(v.get<double>());
      return absl::OkStatus();
    };
    if (absl::Status st = real("lora_alpha", 8.f, &c.alpha); !st.ok()) return st;
    if (absl::Status st = real("lora_dropout", 0.f, &c.dropout); !st.ok()) return st;
    c.use_rslora = j.value("use_rslora", false);
    const nlohmann::json t = j.contains("target_modules") ? j["target_modules"] : nlohmann::json();
    if (t.is_null() && has_parameters) {  // experts only (PEFT's target_parameters)
      c.target_modules.clear();
    } else if (t.is_string()) {
      c.target_modules = {t.get<std::string>()};
      if (c.target_modules[0] != "all-linear") return bad("target_modules as a regular expression is not supported; list the module names");
    } else {
      c.target_modules = t.get<std::vector<std::string>>();
    }
    if (j.contains("target_parameters") && !j["target_parameters"].is_null())
      c.target_parameters = j["target_parameters"].get<std::vector<std::string>>();
    auto nonempty = [&](const char* key) { return j.contains(key) && !j[key].is_null() && !j[key].empty(); };
    if (nonempty("use_dora") && j.value("use_dora", false)) return bad("DoRA adapters (use_dora) are not supported");
    if (nonempty("bias") && j.value("bias", "none") != "none") return bad("LoRA bias training (bias != \"none\") is not supported");
    if (nonempty("fan_in_fan_out") && j.value("fan_in_fan_out", false)) return bad("fan_in_fan_out adapters are not supported");
    for (const char* key : {"modules_to_save", "layers_to_transform"})
      if (nonempty(key)) return bad(absl::StrCat(key, " is not supported"));
    if (nonempty("rank_pattern")) {
      if (!j["rank_pattern"].is_object()) return bad("rank_pattern must be an object of module pattern -> rank");
      for (const auto& [k, v] : j["rank_pattern"].items()) {
        if (k.empty() || k.size() > 256 || !tokenize_pattern(k))
          return bad(absl::StrCat("rank_pattern key \"", k.substr(0, 80), "\" is not supported: module names with \\. ",
                                  "for a dot and .* for any run of characters, 1 to 256 characters"));
        if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 65536)
          return bad(absl::StrCat("rank_pattern[\"", k, "\"] must be an integer from 1 to 65536, got ", v.dump()));
        c.rank_pattern.emplace_back(k, v.get<int64_t>());
      }
    }
    if (nonempty("alpha_pattern")) {
      if (!j["alpha_pattern"].is_object()) return bad("alpha_pattern must be an object of module pattern -> alpha");
      for (const auto& [k, v] : j["alpha_pattern"].items()) {
        if (k.empty() || k.size() > 256 || !tokenize_pattern(k))
          return bad(absl::StrCat("alpha_pattern key \"", k.substr(0, 80), "\" is not supported: module names with \\. ",
                                  "for a dot and .* for any run of characters, 1 to 256 characters"));
        if (!v.is_number() || !std::isfinite(v.get<double>()) || !(v.get<double>() > 0) || v.get<double>() > 1e30)
          return bad(absl::StrCat("alpha_pattern[\"", k, "\"] must be a positive number, got ", v.dump()));
        c.alpha_pattern.emplace_back(k, static_cast<float>(v.get<double>()));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(absl::StrCat("malformed field: ", e.what()));
  }
  if (absl::Status s = check_config(c); !s.ok()) return bad(std::string(s.message()));

  // target_modules that name nothing in this model are the config's fault, not the weights file's.
  std::set<std::string> module_names;
  bool any = false;
  for (const Linear* l : model.linears()) {
    any = any || matches(l->name, c, l->name == "lm_head");
    module_names.insert(l->name.substr(l->name.rfind('.') + 1));
  }
  for (const ExpertLinear* p : model.expert_linears()) any = any || detail::expert_targeted(p->name, c);
  if (!any)
    return bad(absl::StrCat("target_modules [", absl::StrJoin(c.target_modules, ", "), "] match no module of the model ",
                            "(its linear layers are ", absl::StrJoin(module_names, ", "), ")"));
  const std::string st_path = (fs::path(dir) / "adapter_model.safetensors").string();
  auto st = SafetensorsFile::open(st_path);
  if (!st.ok()) return st.status();
  std::set<std::string> used;
  auto read = [&](const std::string& name, const Shape& shape) -> absl::StatusOr<Tensor> {
    const TensorInfo* info = st->find(name);
    if (!info) return absl::NotFoundError(absl::StrCat(st_path, ": missing tensor ", name));
    if (info->shape != shape)
      return absl::InvalidArgumentError(absl::StrCat(st_path, ": tensor ", name, " has shape ", shape_str(info->shape),
                                                     ", expected ", shape_str(shape), " (r = ", c.r, " from ", cfg_path,
                                                     " and the layer's features: an adapter of another rank or model?)"));
    if (!is_float(info->dtype))
      return absl::InvalidArgumentError(absl::StrCat(st_path, ": tensor ", name, " is not a float tensor"));
    used.insert(name);
    Tensor t = read_tensor(*st, *info);
    if (absl::Status s = check_finite(t, st_path, name, " (a damaged adapter, or one saved from a diverged run)"); !s.ok())
      return s;
    return t.to(model.device_of(name), model.precision().adapter);
  };
  for (Linear* l : model.linears()) {
    if (!matches(l->name, c, l->name == "lm_head")) continue;
    const int64_t r = c.rank_for(l->name);
    auto a = read(peft_tensor_name(l->name, true), {r, l->in_features()});
    if (!a.ok()) return a.status();
    auto b = read(peft_tensor_name(l->name, false), {l->out_features(), r});
    if (!b.ok()) return b.status();
    attach(*l, *std::move(a), *std::move(b), c);
  }
  if (absl::Status s = detail::load_expert_lora(model, c, read); !s.ok()) return s;
  for (const TensorInfo& t : st->tensors())
    if (!used.count(t.name))
      return absl::InvalidArgumentError(absl::StrCat(st_path, ": tensor ", t.name, " matches no adapted module of the model"));
  if (used.empty()) return bad("the adapter matches no module of the model");
  return c;
}

void merge_lora(CausalLM& model) {
  detail::merge_expert_lora(model);
  for (Linear* l : model.linears()) {
    if (!l->lora && !l->quantized()) continue;
    // A 4-bit weight is dequantised (QLoRA merges into a dense model in the model's dtype).
    const DType dtype = l->quantized() ? model.dtype() : l->weight.dtype();
    Tensor base = l->dense_weight(DType::f32);
    l->nf4.reset();
    if (!l->lora) {
      l->weight = ag::Variable(base.to(dtype), false);
      continue;
    }
    // [out, in] = scale * B [out, r] x A [r, in], added in f32, rounded once to the weight dtype.
    Tensor delta = ops::matmul(l->lora->B.value(), l->lora->A.value());
    Tensor merged = ops::axpby(base, delta, 1.f, l->lora->scale);
    l->weight = ag::Variable(merged.to(dtype), false);
    l->lora.reset();
  }
}

absl::Status save_pretrained(const CausalLM& model, const std::string& out_dir) {
  const fs::path tmp(out_dir);  // each file below is written to a temporary name and renamed
  std::error_code ec;
  // A sharded model's index beside the new single file would be loaded instead of it.
  if (fs::exists(tmp / "model.safetensors.index.json", ec))
    return absl::AlreadyExistsError(absl::StrCat(out_dir, " holds a sharded model (model.safetensors.index.json): a model ",
                                                 "written there would not be the one loaded; choose another folder"));
  if (absl::Status s = ensure_dir(tmp.string()); !s.ok()) return s;
  for (const Linear* l : model.linears())
    if (l->quantized())
      return absl::FailedPreconditionError(absl::StrCat(l->name, " is 4-bit: merge_lora() dequantises before saving a ",
                                                        "full-precision model (loom merge does)"));
  auto tensors = hf_state_dict(model);  // fused Hugging Face tensors concatenated back from Loom's parts
  if (!tensors.ok()) return tensors.status();
  if (absl::Status s = check_finite_to_save(*tensors, (tmp / "model.safetensors").string()); !s.ok()) return s;
  if (absl::Status s = save_tensors((tmp / "model.safetensors").string(), *tensors, DType::bf16, {{"format", "pt"}}); !s.ok())
    return s;
  nlohmann::json config;
  if (is_gguf_path(model.source_dir())) {  // a model loaded from a .gguf: its config rebuilt from the metadata
    auto gguf = GgufFile::open(model.source_dir());
    if (!gguf.ok()) return gguf.status();
    auto j = gguf_hf_config(*gguf);
    if (!j.ok()) return j.status();
    config = *std::move(j);
  } else {
    auto j = read_json_file((fs::path(model.source_dir()) / "config.json").string());
    if (!j.ok()) return j.status();
    config = *std::move(j);
  }
  // A multimodal source is written as its language model alone (the weights written are only those).
  config = ModelConfig::language_model_json(config, *model.config().family);
  config["dtype"] = "bfloat16";
  if (config.contains("torch_dtype")) config["torch_dtype"] = "bfloat16";
  config.erase("quantization_config");  // the weights written here are dense (a 4-bit source was dequantised)
  if (absl::Status s = write_text_atomic((tmp / "config.json").string(), config.dump(2) + "\n"); !s.ok()) return s;
  // The files that make the folder a complete Hugging Face model besides the weights (tokenizer.model
  // and added_tokens.json too: `loom export` of the merged folder then writes the GGUF vocabulary the
  // source folder gives; chat_template.jinja: where transformers 5 keeps the chat template).
  for (const char* extra : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                            "tokenizer.model", "added_tokens.json", "chat_template.jinja"}) {
    const fs::path src = fs::path(model.source_dir()) / extra;
    if (!fs::exists(src) || fs::equivalent(src.parent_path(), tmp, ec)) continue;
    const fs::path part = tmp / absl::StrCat(extra, ".tmp.", getpid());
    fs::copy_file(src, part, fs::copy_options::overwrite_existing, ec);
    if (!ec) fs::rename(part, tmp / extra, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot copy ", src.string(), " to ", out_dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace loom
