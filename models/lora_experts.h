// Internal to models/: LoRA on mixture-of-experts projections (models/lora.h's entry points call
// these), as PEFT 0.21 puts it on transformers 5.x's stacked experts through `target_parameters`
// (tools/reference/moe_formats.md (c)): one A [r, in] and B [out, r] per expert, W'[e] = W[e] + scale B_e A_e.
// Loom keeps A [E, r, in] and B [E, out, r] for the grouped products; PEFT's ParamWrapper stores
// lora_A [r E, in] (expert e's rows e r .. e r + r - 1: the same bytes) and lora_B [out, r E] (expert
// e's columns e, e + E, e + 2E, ...: rank-major), converted on save and load.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/causal_lm.h"

namespace loom {
struct LoraConfig;
namespace detail {

// True when the expert projection (its name "model.layers.3.mlp.experts.gate_up_proj") is one of
// config.target_parameters: equal, or ending with "." + the entry.
bool expert_targeted(const std::string& name, const LoraConfig& config);
// Fresh adapters on the targeted expert projections (A ~ U(+-1/sqrt(in)), B = 0); counts them into
// *matched. Refuses dropout (PEFT's ParamWrapper has none) and a rank past the projection's sides.
absl::Status add_expert_lora(CausalLM& model, const LoraConfig& config, uint64_t seed, int* matched);
// PEFT's module path of an adapted expert projection: with both projections of a layer adapted,
// gate_up_proj's wrapper is the inner one ("model.layers.3.mlp.experts.base_layer") and down_proj's
// the outer ("model.layers.3.mlp.experts"); a lone one is the outer.
std::string peft_expert_module(const CausalLM& model, const ExpertLinear& proj);
// The adapters' A and B (or, with grads, their gradients) in PEFT's names and layouts, model order.
std::vector<std::pair<std::string, Tensor>> peft_expert_tensors(const CausalLM& model, bool grads);
// Reads the targeted projections' adapters through `read` (PEFT name, PEFT shape -> tensor on the
// model's device in the adapter dtype) and attaches them.
using ReadAdapterTensor = std::function<absl::StatusOr<Tensor>(const std::string& name, const Shape& shape)>;
absl::Status load_expert_lora(CausalLM& model, const LoraConfig& config, const ReadAdapterTensor& read);
// W[e] <- W[e] + scale B_e A_e (f32) into every adapted expert projection, dequantising NF4 experts,
// and drops the adapters.
void merge_expert_lora(CausalLM& model);

}  // namespace detail
}  // namespace loom
