// See moe_config.h.
#include "models/moe_config.h"

#include "absl/strings/str_cat.h"
#include "models/config_fields.h"

namespace loom {

MoeConfig read_moe_config(const ConfigFields& f, const MoeRules& rules, int64_t layers, int64_t intermediate_size) {
  MoeConfig m;
  // config.json as transformers saves it says num_local_experts (MixtralConfig's attribute_map, and
  // Qwen3MoeConfig's); hub Qwen3-MoE files say num_experts. Both at once must agree.
  const std::optional<int64_t> local = f.opt_int("num_local_experts"), plain = f.opt_int("num_experts");
  if (local && plain && *local != *plain)
    f.bad("num_experts", absl::StrCat("differs from num_local_experts = ", *local, " (the same count under two names)"));
  m.experts = local ? *local : plain ? *plain : rules.default_experts;
  if (m.experts < 1) f.bad(local ? "num_local_experts" : "num_experts", "must be at least 1");
  m.experts_per_token = f.get_int("num_experts_per_tok", rules.default_experts_per_token);
  if (m.experts_per_token < 1 || m.experts_per_token > m.experts)
    f.bad("num_experts_per_tok", absl::StrCat("must be between 1 and the ", m.experts, " experts"));
  m.expert_intermediate = rules.own_expert_width ? f.get_int("moe_intermediate_size", rules.default_expert_width)
                                                 : intermediate_size;
  if (m.expert_intermediate < 1) f.bad(rules.own_expert_width ? "moe_intermediate_size" : "intermediate_size", "must be at least 1");
  m.renormalize = rules.renormalize_key ? f.get_bool("norm_topk_prob", false) : true;
  m.router_aux_loss_coef = f.get_double("router_aux_loss_coef", 0.001);
  if (!(m.router_aux_loss_coef >= 0)) f.bad("router_aux_loss_coef", "must be a number >= 0");
  m.output_router_logits = f.get_bool("output_router_logits", false);
  if (f.get_double("router_jitter_noise", 0.0) != 0.0)
    f.bad("router_jitter_noise", "Loom routes without jitter noise (transformers adds it in training only); set it to 0");
  m.layer_is_moe.assign(layers, true);
  if (rules.sparse_layers) {
    const int64_t step = f.get_int("decoder_sparse_step", 1);
    if (step < 1) f.bad("decoder_sparse_step", "must be at least 1");
    std::vector<int64_t> dense;
    if (f.set("mlp_only_layers")) {
      if (!f.at("mlp_only_layers").is_array()) f.wrong("mlp_only_layers", "a list of layer indices");
      for (const auto& v : f.at("mlp_only_layers")) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= layers)
          f.bad("mlp_only_layers", absl::StrCat("holds ", show_json(v), ", not a layer index below ", layers));
        dense.push_back(v.get<int64_t>());
      }
    }
    // transformers: MoE where layer_idx is not in mlp_only_layers and (layer_idx + 1) % step == 0.
    for (int64_t i = 0; i < layers; ++i)
      m.layer_is_moe[i] = std::find(dense.begin(), dense.end(), i) == dense.end() && (i + 1) % step == 0;
  }
  return m;
}

}  // namespace loom
