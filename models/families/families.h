// Internal to models/: the family specs, one per file in this folder, and what their files share.
// models/families/registry.cpp lists them; nothing else names a family.
#pragma once
#include "engine/gguf.h"
#include "engine/gguf_writer.h"
#include "models/block.h"
#include "models/config_fields.h"
#include "models/family.h"

namespace loom::families {

const FamilySpec& llama();    // llama.cpp
const FamilySpec& mistral();  // mistral.cpp: Llama with a sliding window
const FamilySpec& qwen2();    // qwen2.cpp
const FamilySpec& qwen3();    // qwen3.cpp: Qwen2 with q/k norms
const FamilySpec& gemma();    // gemma.cpp
const FamilySpec& gemma2();   // gemma2.cpp: Gemma with sandwich norms, soft-caps and windows
const FamilySpec& gemma3();   // gemma3.cpp: Gemma 2 with q/k norms and a local RoPE base
const FamilySpec& gemma3_multimodal();  // gemma3.cpp: its language model in a multimodal checkpoint
const FamilySpec& phi3();     // phi3.cpp: fused qkv_proj and gate_up_proj, LongRoPE, partial rotary
const FamilySpec& mixtral();  // mixtral.cpp: Mistral's attention, mixture-of-experts MLPs
const FamilySpec& qwen3_moe();  // qwen3_moe.cpp: Qwen3's attention, mixture-of-experts MLPs (some dense)

// The model-level weights every family has: embeddings, the final norm (its GGUF fix given) and lm_head.
std::vector<WeightRule> standard_top_weights(GgufFix norm_fix);

// GGUF <arch>.expert_count and expert_used_count (moe_gguf.cpp), written from and read into config.json
// (the expert count under `count_key`: num_local_experts or num_experts).
void moe_config_to_gguf(const ModelConfig& c, const std::string& p, GgufWriter& w);
absl::Status moe_gguf_to_config(const GgufFile& f, const std::string& p, const char* count_key, nlohmann::json& j);

}  // namespace loom::families
