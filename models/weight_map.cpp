// Names through a family's weight map (models/weight_map.h).
#include "models/weight_map.h"

#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "models/causal_lm.h"

namespace loom {
namespace {

constexpr std::string_view kHfLayers = "model.layers.";
constexpr std::string_view kGgufLayers = "blk.";

// "model.layers.3.self_attn.q_proj.weight" -> {layer 3, "self_attn.q_proj", ".weight"}; layer -1 for a
// model-level name. False when the name is not <module>.weight / <module>.bias (with a valid layer).
struct Parsed {
  int layer = -1;
  std::string module, suffix;
};
bool parse_name(const std::string& name, std::string_view layers_prefix, Parsed* out) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  out->suffix = name.substr(dot);
  if (out->suffix != ".weight" && out->suffix != ".bias") return false;
  std::string stem = name.substr(0, dot);
  out->layer = -1;
  if (stem.starts_with(layers_prefix)) {
    const std::string rest = stem.substr(layers_prefix.size());
    const size_t d = rest.find('.');
    if (d == std::string::npos || !absl::SimpleAtoi(rest.substr(0, d), &out->layer) || out->layer < 0) return false;
    stem = rest.substr(d + 1);
  }
  out->module = std::move(stem);
  return true;
}

std::string join(const Parsed& p, std::string_view layers_prefix, const std::string& module) {
  return p.layer < 0 ? module + p.suffix : absl::StrCat(std::string(layers_prefix), p.layer, ".", module, p.suffix);
}

int64_t rows_of(Rows r, const ModelConfig& c) {
  switch (r) {
    case Rows::kQDim: return c.q_dim();
    case Rows::kKvDim: return c.kv_dim();
    case Rows::kIntermediate: return c.intermediate_size;
  }
  return 0;
}

}  // namespace

absl::StatusOr<HfSource> hf_source(const FamilySpec& family, const ModelConfig& c, const std::string& loom_name) {
  Parsed p;
  const WeightRule* rule = parse_name(loom_name, kHfLayers, &p) ? family.rule_for_loom(p.module, p.layer >= 0) : nullptr;
  if (!rule)
    return absl::InternalError(absl::StrCat("the ", family.name, " weight map has no rule for Loom's tensor '",
                                            loom_name, "'"));
  HfSource s;
  s.name = join(p, kHfLayers, rule->hf);
  if (rule->loom.size() < 2) return s;
  if (rule->rows.size() != rule->loom.size())
    return absl::InternalError(absl::StrCat("the ", family.name, " weight rule for '", rule->hf, "' splits into ",
                                            rule->loom.size(), " parts but gives ", rule->rows.size(), " row counts"));
  for (size_t i = 0; i < rule->loom.size(); ++i) {
    const int64_t n = rows_of(rule->rows[i], c);
    if (rule->loom[i] == p.module) {
      s.row0 = s.total_rows;
      s.rows = n;
    }
    s.total_rows += n;
  }
  return s;
}

std::optional<std::vector<std::pair<std::string, Tensor>>> hf_expert_tensors(const ModelConfig& c, const std::string& name,
                                                                             const Tensor& t) {
  constexpr std::string_view kExperts = ".mlp.experts.";
  const size_t at = name.find(kExperts);
  if (!c.family->moe || at == std::string::npos || !name.starts_with(kHfLayers)) return std::nullopt;
  const FamilySpec::MoeSpec& spec = *c.family->moe;
  const std::string layer = name.substr(0, at + 1);  // "model.layers.3."
  const std::string proj = name.substr(at + kExperts.size());
  const int64_t experts = t.size(0), rows = t.size(1), cols = t.size(2);
  std::vector<std::pair<std::string, Tensor>> out;
  for (int64_t e = 0; e < experts; ++e) {
    const std::string p = absl::StrCat(layer, spec.experts, ".", e, ".");
    const Tensor m = t.narrow(0, e, 1).reshape({rows, cols});
    if (proj == "gate_up_proj") {  // gate rows, then up rows
      out.emplace_back(p + spec.gate + ".weight", m.narrow(0, 0, rows / 2));
      out.emplace_back(p + spec.up + ".weight", m.narrow(0, rows / 2, rows / 2));
    } else {
      out.emplace_back(p + spec.down + ".weight", m);
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> hf_state_dict(const CausalLM& model, bool stacked_experts) {
  const ModelConfig& c = model.config();
  std::vector<std::pair<std::string, Tensor>> out;
  std::map<std::string, size_t> fused;          // Hugging Face name -> its index in `out`
  std::map<std::string, int64_t> rows_missing;  // Hugging Face name -> rows no part has filled yet
  for (const auto& [name, v] : model.named_weights()) {
    if (auto experts = hf_expert_tensors(c, name, v->value())) {  // stacked experts: one tensor per expert
      if (stacked_experts) experts = {{name, v->value()}};
      for (auto& t : *experts) out.push_back(std::move(t));
      continue;
    }
    auto src = hf_source(*c.family, c, name);
    if (!src.ok()) return src.status();
    const Tensor& t = v->value();
    if (!src->part()) {
      out.emplace_back(src->name, t);
      continue;
    }
    auto it = fused.find(src->name);
    if (it == fused.end()) {
      Shape shape = t.shape();
      shape[0] = src->total_rows;
      it = fused.emplace(src->name, out.size()).first;
      out.emplace_back(src->name, Tensor::zeros(shape, t.dtype(), t.device()));
      rows_missing[src->name] = src->total_rows;
    }
    out[it->second].second.narrow(0, src->row0, src->rows).copy_(t);
    rows_missing[src->name] -= src->rows;
  }
  for (const auto& [name, missing] : rows_missing)  // a 4-bit part has no dense weight to concatenate
    if (missing != 0)
      return absl::FailedPreconditionError(absl::StrCat("'", name, "' is fused from parts of which some are 4-bit (or ",
                                                        "missing): dequantise the model first (loom merge does)"));
  return out;
}

std::optional<GgufMapping> gguf_to_hf(const FamilySpec& family, const std::string& gguf_name) {
  Parsed p;
  if (!parse_name(gguf_name, kGgufLayers, &p)) return std::nullopt;
  for (const WeightRule& r : p.layer < 0 ? family.top_weights : family.layer_weights)
    if (!r.gguf.empty() && r.gguf == p.module) return GgufMapping{join(p, kHfLayers, r.hf), r.fix};
  return std::nullopt;
}

std::optional<GgufMapping> hf_to_gguf(const FamilySpec& family, const std::string& hf_name) {
  Parsed p;
  if (!parse_name(hf_name, kHfLayers, &p)) return std::nullopt;
  for (const WeightRule& r : p.layer < 0 ? family.top_weights : family.layer_weights)
    if (!r.gguf.empty() && r.hf == p.module) return GgufMapping{join(p, kGgufLayers, r.gguf), r.fix};
  return std::nullopt;
}

namespace {
// llama.cpp's names of the stacked experts (gguf-py constants.py MODEL_TENSOR.FFN_{GATE,UP,DOWN}_EXP).
constexpr const char* kGateExps = "ffn_gate_exps";
constexpr const char* kUpExps = "ffn_up_exps";
constexpr const char* kDownExps = "ffn_down_exps";
}  // namespace

std::optional<std::vector<std::pair<std::string, Tensor>>> gguf_expert_tensors(const std::string& name, const Tensor& t) {
  constexpr std::string_view kExperts = ".mlp.experts.";
  const size_t at = name.find(kExperts);
  int layer = -1;
  if (at == std::string::npos || !name.starts_with(kHfLayers) ||
      !absl::SimpleAtoi(name.substr(kHfLayers.size(), at - kHfLayers.size()), &layer) || layer < 0)
    return std::nullopt;
  const std::string proj = name.substr(at + kExperts.size());
  auto gguf = [&](const char* part) { return absl::StrCat(std::string(kGgufLayers), layer, ".", part, ".weight"); };
  if (proj == "down_proj") return std::vector<std::pair<std::string, Tensor>>{{gguf(kDownExps), t}};
  if (proj != "gate_up_proj") return std::nullopt;
  const int64_t half = t.size(1) / 2;  // gate rows, then up rows
  return std::vector<std::pair<std::string, Tensor>>{{gguf(kGateExps), t.narrow(1, 0, half)},
                                                     {gguf(kUpExps), t.narrow(1, half, half)}};
}

std::optional<std::string> hf_expert_name_from_gguf(const FamilySpec& family, const std::string& gguf_name) {
  Parsed p;
  if (!family.moe || !parse_name(gguf_name, kGgufLayers, &p) || p.layer < 0 || p.suffix != ".weight") return std::nullopt;
  const FamilySpec::MoeSpec& spec = *family.moe;
  const std::string* part = p.module == kGateExps ? &spec.gate : p.module == kUpExps ? &spec.up
                            : p.module == kDownExps ? &spec.down : nullptr;
  if (!part) return std::nullopt;
  return absl::StrCat(std::string(kHfLayers), p.layer, ".", spec.experts, ".{e}.", *part, ".weight");
}

}  // namespace loom
