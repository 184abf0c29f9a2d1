// The MoE config reader (models/moe_config.h) against what transformers 5.17's MixtralConfig and
// Qwen3MoeConfig make of the same config.json (tests/fixtures/models/moe_config_cases.json, written by
// tools/reference/make_moe_config_cases.py), and its refusals naming the field.
#include "models/moe_config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "models/config_fields.h"

namespace loom {
namespace {

MoeRules rules_of(const std::string& family) {
  if (family == "mixtral") return MoeRules{};
  return MoeRules{128, 8, true, 768, true, true};
}

MoeConfig read(const nlohmann::json& config, const std::string& family) {
  return read_moe_config(ConfigFields(config, "config.json", ""), rules_of(family), config["num_hidden_layers"].get<int64_t>(),
                         config["intermediate_size"].get<int64_t>());
}

TEST(MoeConfig, ReadsWhatTransformersReads) {
  std::ifstream f(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/models/moe_config_cases.json");
  const nlohmann::json cases = nlohmann::json::parse(f);
  ASSERT_GE(cases["cases"].size(), 7u);
  for (const auto& c : cases["cases"]) {
    const MoeConfig m = read(c["config"], c["family"]);
    const auto& w = c["want"];
    const std::string what = c["config"].dump();
    EXPECT_EQ(m.experts, w["experts"].get<int64_t>()) << what;
    EXPECT_EQ(m.experts_per_token, w["experts_per_token"].get<int64_t>()) << what;
    EXPECT_EQ(m.expert_intermediate, w["expert_intermediate"].get<int64_t>()) << what;
    EXPECT_EQ(m.renormalize, w["renormalize"].get<bool>()) << what;
    EXPECT_EQ(m.router_aux_loss_coef, w["router_aux_loss_coef"].get<double>()) << what;
    EXPECT_EQ(m.output_router_logits, w["output_router_logits"].get<bool>()) << what;
    EXPECT_EQ(m.layer_is_moe, w["layer_is_moe"].get<std::vector<bool>>()) << what;
  }
}

TEST(MoeConfig, RefusalsNameTheField) {
  const nlohmann::json base = {{"num_hidden_layers", 4}, {"intermediate_size", 16}};
  for (const auto& [extra, family, says] : std::vector<std::tuple<nlohmann::json, std::string, std::string>>{
           {{{"num_local_experts", 4}, {"num_experts", 8}}, "mixtral", "num_experts"},
           {{{"num_experts_per_tok", 9}}, "mixtral", "num_experts_per_tok"},
           {{{"num_experts", 0}}, "qwen3_moe", "num_experts"},
           {{{"decoder_sparse_step", 0}}, "qwen3_moe", "decoder_sparse_step"},
           {{{"mlp_only_layers", {7}}}, "qwen3_moe", "mlp_only_layers"},
           {{{"router_jitter_noise", 0.1}}, "mixtral", "router_jitter_noise"}}) {
    nlohmann::json c = base;
    c.update(extra);
    try {
      read(c, family);
      ADD_FAILURE() << "accepted " << c.dump();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.status.message()).find(says), std::string::npos) << e.status;
    }
  }
}

}  // namespace
}  // namespace loom
