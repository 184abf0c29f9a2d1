// The mixture-of-experts metadata of llama.cpp's GGUF files that Mixtral (as `llama`) and Qwen3-MoE
// (as `qwen3moe`) share: convert_hf_to_gguf.py's TextModel writes <arch>.expert_count from
// num_local_experts / num_experts and <arch>.expert_used_count from num_experts_per_tok
// (tools/reference/moe_formats.md (e); gguf-py constants.py Keys.LLM.EXPERT_COUNT, EXPERT_USED_COUNT).
#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "models/families/families.h"

namespace loom::families {

void moe_config_to_gguf(const ModelConfig& c, const std::string& p, GgufWriter& w) {
  w.add(p + "expert_count", gguf_u32(static_cast<uint32_t>(c.moe.experts)));
  w.add(p + "expert_used_count", gguf_u32(static_cast<uint32_t>(c.moe.experts_per_token)));
}

absl::Status moe_gguf_to_config(const GgufFile& f, const std::string& p, const char* count_key, nlohmann::json& j) {
  LOOM_ASSIGN_OR_RETURN(const int64_t experts, f.get_int(p + "expert_count"));
  LOOM_ASSIGN_OR_RETURN(const int64_t used, f.get_int(p + "expert_used_count"));
  j[count_key] = experts;
  j["num_experts_per_tok"] = used;
  return absl::OkStatus();
}

}  // namespace loom::families
