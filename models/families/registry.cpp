// The family registry: the one list of supported families (add a new one here), and the lookups by
// config.json model_type / architectures and GGUF general.architecture.
#include "absl/strings/str_cat.h"
#include "models/families/families.h"

namespace loom {

const std::vector<const FamilySpec*>& model_families() {
  static const std::vector<const FamilySpec*> kAll = {
      &families::llama(), &families::mistral(), &families::qwen2(),
      &families::qwen3(), &families::gemma(),   &families::gemma2(), &families::gemma3(),
      &families::gemma3_multimodal(), &families::phi3(),   &families::mixtral(), &families::qwen3_moe(),
  };
  return kAll;
}

std::string family_names(bool (*pred)(const FamilySpec&)) {
  std::string out;
  for (const FamilySpec* f : model_families())
    if (pred(*f)) absl::StrAppend(&out, out.empty() ? "" : ", ", f->name);
  return out;
}

absl::StatusOr<const FamilySpec*> family_from_model_type(const std::string& model_type) {
  for (const FamilySpec* f : model_families())
    for (const std::string& t : f->model_types)
      if (t == model_type) return f;
  return absl::InvalidArgumentError(absl::StrCat("model_type '", model_type, "' is not supported (supported: ",
                                                 family_names([](const FamilySpec&) { return true; }), ")"));
}

const FamilySpec* family_from_architecture(const std::string& architecture) {
  for (const FamilySpec* f : model_families())
    for (const std::string& a : f->architectures)
      if (a == architecture) return f;
  return nullptr;
}

const FamilySpec* family_from_gguf_architecture(const std::string& arch, bool experts) {
  for (const FamilySpec* f : model_families())
    if (!f->gguf_read_arch.empty() && f->gguf_read_arch == arch && f->moe.has_value() == experts) return f;
  return nullptr;
}

namespace families {

std::vector<WeightRule> standard_top_weights(GgufFix norm_fix) {
  return {{"model.embed_tokens", "token_embd"}, {"model.norm", "output_norm", norm_fix}, {"lm_head", "output"}};
}

}  // namespace families

const WeightRule* FamilySpec::rule_for_loom(const std::string& loom_module, bool in_layer) const {
  for (const WeightRule& r : in_layer ? layer_weights : top_weights) {
    if (r.loom.empty() && r.hf == loom_module) return &r;
    for (const std::string& part : r.loom)
      if (part == loom_module) return &r;
  }
  return nullptr;
}

}  // namespace loom
