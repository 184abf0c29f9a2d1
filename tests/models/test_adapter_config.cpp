// adapter_config.json numbers checked before they are converted (fuzz_adapter_config found "r":
// 8.4e47 cast to int64, undefined behaviour): a rank that is not a small integer and a non-finite or
// huge lora_alpha / lora_dropout are errors naming the field; PEFT's own file loads.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "models/lora.h"
#include "nlohmann/json.hpp"
#include "tests/models/fixtures.h"
#include "tests/temp_dir.h"

namespace loom::test {
namespace {

TEST(AdapterConfig, NumbersAreCheckedBeforeConversion) {
  TempDir d;
  const std::string src = fixture_dir("llama") + "/adapter";
  std::filesystem::copy_file(src + "/adapter_model.safetensors", d.file("adapter_model.safetensors"));
  std::ifstream in(src + "/adapter_config.json");
  const nlohmann::json good = nlohmann::json::parse(in);
  auto load_with = [&](const nlohmann::json& cfg) {
    std::ofstream(d.file("adapter_config.json")) << cfg.dump();
    auto model = CausalLM::load(fixture_dir("llama"), {DType::f32, Device::cpu()});
    EXPECT_TRUE(model.ok()) << model.status();
    return load_adapter(**model, d.path()).status();
  };
  EXPECT_TRUE(load_with(good).ok());
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* says;
  };
  for (const Case& c : {Case{"r", 8.444444444444444e47, "r must be an integer from 1 to 65536"},
                        Case{"r", 8.5, "r must be an integer"}, Case{"r", 0, "r must be an integer"},
                        Case{"r", "8", "r must be an integer"}, Case{"lora_alpha", 1e300, "lora_alpha must be a finite number"},
                        Case{"lora_dropout", "0.1", "lora_dropout must be a finite number"}}) {
    nlohmann::json bad = good;
    bad[c.key] = c.value;
    const absl::Status s = load_with(bad);
    EXPECT_FALSE(s.ok()) << c.key << " " << c.value.dump();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s;
    EXPECT_NE(s.message().find("adapter_config.json"), std::string::npos) << s;
  }
}

// rank_pattern keys as PEFT matches them, re.match(rf"(.*\.)?({key})$", name): the expectations are
// what Python's re gives for these pairs. Keys with other regular-expression syntax are refused (a
// backtracking engine on such a key hung fuzz_adapter_config: corpus finding_regex_backtracking).
TEST(AdapterConfig, PatternKeysMatchAsPeftDoes) {
  const std::vector<std::string> names = {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.self_attn.q_proj",
                                          "model.layers.11.self_attn.q_proj", "lm_head", "model.layers.0.mlp.up_proj"};
  const std::vector<std::pair<std::string, std::vector<bool>>> cases = {
      {".*\\.gate_up_proj", {true, false, false, false, false}},
      {"gate_up_proj", {true, false, false, false, false}},
      {"up_proj", {false, false, false, false, true}},
      {"layers.1.self_attn.q_proj", {false, true, false, false, false}},
      {"layers\\.1\\.self_attn\\.q_proj", {false, true, false, false, false}},
      {"model\\.layers\\..*\\.q_proj", {false, true, true, false, false}},
      {"lm_head", {false, false, false, true, false}},
      {".*head", {false, false, false, true, false}},
      {"layers\\.1.\\.self_attn\\.q_proj", {false, false, true, false, false}},
  };
  for (const auto& [key, want] : cases) {
    LoraConfig c;
    c.r = 8;
    c.rank_pattern = {{key, 4}};
    for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(c.rank_for(names[i]) == 4, want[i]) << key << " " << names[i];
  }
  TempDir d;
  const std::string src = fixture_dir("llama") + "/adapter";
  std::filesystem::copy_file(src + "/adapter_model.safetensors", d.file("adapter_model.safetensors"));
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/adapter_config.json"));
  for (const char* key : {"(a*)*b", "q_proj|v_proj", "[qv]_proj", "q_proj$"}) {
    cfg["rank_pattern"] = {{key, 4}};
    std::ofstream(d.file("adapter_config.json")) << cfg.dump();
    auto model = CausalLM::load(fixture_dir("llama"), {DType::f32, Device::cpu()});
    ASSERT_TRUE(model.ok());
    const absl::Status s = load_adapter(**model, d.path()).status();
    EXPECT_FALSE(s.ok()) << key;
    EXPECT_NE(std::string(s.message()).find("rank_pattern key"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace loom::test
