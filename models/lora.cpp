// LoRA injection and PEFT adapter files (see lora.h); its config in lora_config.cpp, merging in lora_merge.cpp.
#include "models/lora.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/splitmix64.h"
#include "engine/tensor_io.h"
#include "engine/text_file.h"
#include "models/finite_check.h"
#include "models/lora_experts.h"
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

void attach(Linear& l, Tensor a, Tensor b, const LoraConfig& c) {
  auto lora = std::make_unique<LoraAdapter>();
  lora->A = ag::Variable(std::move(a), true);
  lora->B = ag::Variable(std::move(b), true);
  lora->scale = c.scale_for(l.name);
  lora->dropout = c.dropout;
  l.lora = std::move(lora);
}

// Room beside W for B in the one-GEMM product (Linear::widen_for_adapter) for the adapted
// projections that read a norm's output (the only inputs given spare columns).
void widen_norm_readers(CausalLM& model) {
  for (Linear* l : model.norm_readers())
    if (l->lora) l->widen_for_adapter();
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
  widen_norm_readers(model);
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
  if (absl::Status s = create_folder(dir); !s.ok()) return s;
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
        if (k.empty() || k.size() > 256 || !LoraConfig::pattern_supported(k))
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
        if (k.empty() || k.size() > 256 || !LoraConfig::pattern_supported(k))
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
  widen_norm_readers(model);
  if (absl::Status s = detail::load_expert_lora(model, c, read); !s.ok()) return s;
  for (const TensorInfo& t : st->tensors())
    if (!used.count(t.name))
      return absl::InvalidArgumentError(absl::StrCat(st_path, ": tensor ", t.name, " matches no adapted module of the model"));
  if (used.empty()) return bad("the adapter matches no module of the model");
  return c;
}

}  // namespace loom
