// A mixture-of-experts model's config keys, as transformers 5.17's MixtralConfig and
// Qwen3MoeConfig read them (tools/reference/moe_formats.md): the expert count (`num_local_experts`, which
// config.json files of both write, or `num_experts`, which hub Qwen3-MoE files write), the experts a
// token uses, the expert width, whether the chosen weights are renormalised, the load-balancing
// loss's coefficient, and which layers are MoE (Qwen3: every `decoder_sparse_step`-th layer not in
// `mlp_only_layers`). The families that read them: models/families/mixtral.cpp and qwen3_moe.cpp.
#pragma once
#include <cstdint>
#include <vector>

namespace loom {

class ConfigFields;  // models/config_fields.h

struct MoeConfig {
  int64_t experts = 0;            // 0: a dense model
  int64_t experts_per_token = 0;  // top k
  int64_t expert_intermediate = 0;
  bool renormalize = true;        // the top-k weights divided by their sum (Mixtral always; Qwen3 by norm_topk_prob)
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;  // transformers adds coef x aux to the loss only when this is set
  std::vector<bool> layer_is_moe;     // one entry per layer
};

// The rules a family gives: Mixtral's expert width is `intermediate_size` and it always renormalises;
// Qwen3-MoE has `moe_intermediate_size` and `norm_topk_prob`, and dense layers by step and list.
struct MoeRules {
  int64_t default_experts = 8, default_experts_per_token = 2;
  bool own_expert_width = false;     // `moe_intermediate_size` (default default_expert_width)
  int64_t default_expert_width = 768;
  bool renormalize_key = false;      // `norm_topk_prob` (default false) instead of always
  bool sparse_layers = false;        // `decoder_sparse_step` and `mlp_only_layers`
};

// Throws through ConfigFields (errors name the field). `intermediate_size`: the config's.
MoeConfig read_moe_config(const ConfigFields& f, const MoeRules& rules, int64_t num_hidden_layers,
                          int64_t intermediate_size);

}  // namespace loom
