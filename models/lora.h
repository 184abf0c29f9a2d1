// LoRA: injection into a CausalLM's Linear modules with PEFT's initialisation, and adapters and
// merged checkpoints in the Hugging Face formats (PEFT's adapter_config.json +
// adapter_model.safetensors; a bf16 transformers folder for the merged model).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/causal_lm.h"

namespace loom {

struct LoraConfig {
  int64_t r = 16;
  float alpha = 16.f;
  float dropout = 0.f;
  bool use_rslora = false;  // scale alpha / sqrt(r) instead of alpha / r
  // PEFT semantics: a module matches when its name equals an entry or ends with "." + entry;
  // "all-linear" means every Linear but the output head. The default names every projection of every
  // family: the separate ones, and Phi-3's fused qkv_proj and gate_up_proj (names a model lacks match
  // nothing, as in PEFT).
  std::vector<std::string> target_modules = {"q_proj",  "k_proj",    "v_proj",   "o_proj",      "gate_proj",
                                             "up_proj", "down_proj", "qkv_proj", "gate_up_proj"};
  // PEFT's target_parameters: mixture-of-experts projections ("mlp.experts.gate_up_proj",
  // "mlp.experts.down_proj"), matched as target_modules are (models/lora_experts.h). Empty: none.
  std::vector<std::string> target_parameters;

  // PEFT's rank_pattern / alpha_pattern: a module (or expert parameter) whose name matches a key
  // (`(.*\.)?(key)$`, the first in key order) gets that rank / alpha instead of r / alpha. PEFT
  // writes {".*\\.gate_up_proj": 2r} when it turns the v4 names gate_proj/up_proj into expert targets.
  std::vector<std::pair<std::string, int64_t>> rank_pattern;
  std::vector<std::pair<std::string, float>> alpha_pattern;

  float scale() const;
  int64_t rank_for(const std::string& name) const;
  float scale_for(const std::string& name) const;
  // Whether a rank_pattern / alpha_pattern key is one Loom matches: module names with "\." for a
  // dot, "." for any character and ".*" for any run of them (no other regular-expression syntax).
  static bool pattern_supported(const std::string& key);
};

// Adds fresh adapters: A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming_uniform_ with a = sqrt(5))
// from the counter-based RNG, B = 0, and dropout streams from seed_lora_dropout(seed). Errors if
// nothing matches or r/alpha/dropout are out of range.
absl::Status add_lora(CausalLM& model, const LoraConfig& config, uint64_t seed);

// The one rule for LoRA dropout's random streams: the i-th adapted module (model order, from 1)
// draws from Philox key mix(seed ^ mix(i)), offset 0 (the trainer moves the offset each
// micro-batch). add_lora applies it; a resumed run applies it again after load_adapter.
void seed_lora_dropout(CausalLM& model, uint64_t seed);

// The adapter tensors under their PEFT names ("base_model.model.<module>.lora_A.weight"), A then B
// for each adapted module in model order, then each adapted expert projection's (in Loom's layout,
// [E, r, in] and [E, out, r]; peft_adapter_tensors gives PEFT's).
std::vector<std::pair<std::string, ag::Variable*>> lora_parameters(CausalLM& model);
std::string peft_tensor_name(const std::string& module, bool lora_a);
// Every adapter tensor (grads: its gradient) as PEFT names and lays it out in adapter_model.safetensors.
std::vector<std::pair<std::string, Tensor>> peft_adapter_tensors(const CausalLM& model, bool grads = false);

// Writes dir/adapter_config.json and dir/adapter_model.safetensors (f32), each to a temporary
// name first and then renamed.
absl::Status save_adapter(const CausalLM& model, const LoraConfig& config, const std::string& dir);
// Reads a PEFT LoRA adapter, injects it into the matching modules and returns its config.
// Unsupported options (DoRA, bias training, rank/alpha patterns, modules_to_save, ...) are errors.
absl::StatusOr<LoraConfig> load_adapter(CausalLM& model, const std::string& dir);

// The model without its LoRA adapters for the scope (the same base weights, no copy): a LoRA
// policy's reference model in DPO and IPO, as PEFT's disable_adapter(). Restores them on exit.
class AdaptersOff {
 public:
  explicit AdaptersOff(CausalLM& model);
  ~AdaptersOff();
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;

 private:
  std::vector<LoraAdapter*> off_;
};

// W <- W + scale * B A for every adapted module (computed in f32) and drops the adapters.
void merge_lora(CausalLM& model);
// Writes a Hugging Face checkpoint of the model's current weights in bf16 into out_dir (created
// if needed): model.safetensors, config.json (dtype set to bfloat16), and the source's
// generation/tokenizer files. Each file goes to a temporary name first and is renamed.
absl::Status save_pretrained(const CausalLM& model, const std::string& out_dir);

}  // namespace loom
