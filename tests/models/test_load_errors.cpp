// Bad checkpoints and adapters give errors that name the file and tensor; none crashes.
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "models/lora.h"
#include "nlohmann/json.hpp"
#include "tests/models/fixtures.h"

namespace loom::test {
namespace {
namespace fs = std::filesystem;

// A copy of a fixture model folder whose model.safetensors is rewritten by `edit`.
std::string broken_copy(const std::string& variant, const std::string& tag,
                        const std::function<void(std::map<std::string, Tensor>&)>& edit) {
  const std::string dir = ::testing::TempDir() + "loom_broken_" + variant + "_" + tag;
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(fixture_dir(variant) + "/config.json", dir + "/config.json");
  auto tensors = read_all(fixture_dir(variant) + "/model.safetensors");
  edit(tensors);
  std::vector<TensorToWrite> entries;
  for (auto& [name, t] : tensors)
    entries.push_back({name, t.dtype(), t.shape(),
                       std::span<const uint8_t>(static_cast<const uint8_t*>(t.data_ptr()), static_cast<size_t>(t.nbytes()))});
  EXPECT_TRUE(write_safetensors(dir + "/model.safetensors", entries).ok());
  return dir;
}

void expect_error(const std::string& dir, const std::vector<std::string>& words) {
  auto m = CausalLM::load(dir, {DType::f32, Device::cpu()});
  ASSERT_FALSE(m.ok()) << dir << " loaded but should not";
  const std::string msg(m.status().message());
  for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "message lacks '" << w << "': " << msg;
}

TEST(LoadErrors, MissingTensorIsNamed) {
  expect_error(broken_copy("llama", "missing", [](auto& t) { t.erase("model.layers.1.mlp.up_proj.weight"); }),
               {"model.layers.1.mlp.up_proj.weight"});
}

TEST(LoadErrors, ShapeDisagreeingWithConfigIsNamed) {
  expect_error(broken_copy("llama", "shape",
                           [](auto& t) { t["model.layers.0.self_attn.k_proj.weight"] = Tensor::zeros({16, 64}, DType::f32); }),
               {"model.layers.0.self_attn.k_proj.weight", "[32, 64]", "[16, 64]"});
}

TEST(LoadErrors, UnexpectedTensorIsNamed) {
  expect_error(broken_copy("qwen3", "extra", [](auto& t) { t["model.layers.0.self_attn.rotary_scale"] = Tensor::zeros({4}, DType::f32); }),
               {"model.layers.0.self_attn.rotary_scale"});
}

TEST(LoadErrors, UnknownArchitectureListsSupportedOnes) {
  const std::string dir = ::testing::TempDir() + "loom_broken_arch";
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "gpt_neox", "vocab_size": 8, "hidden_size": 8})";
  expect_error(dir, {"gpt_neox", "llama", "qwen2", "gemma2"});
}

TEST(LoadErrors, MissingFolderAndMalformedConfig) {
  expect_error("/nonexistent/model", {"/nonexistent/model"});
  const std::string dir = ::testing::TempDir() + "loom_broken_json";
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << "{ not json";
  expect_error(dir, {"config.json"});
}

TEST(LoadErrors, TruncatedWeightsFile) {
  const std::string dir = broken_copy("gemma", "trunc", [](auto&) {});
  fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") / 2);
  expect_error(dir, {"model.safetensors"});
}

TEST(LoadErrors, AdapterWithWrongRankOrForeignModulesIsRejected) {
  auto model = CausalLM::load(fixture_dir("llama"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok());
  // qwen3's adapter has head_dim 32 projections: shapes disagree with llama's.
  auto r = load_adapter(**model, fixture_dir("qwen3") + "/adapter");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("self_attn.q_proj.lora_B.weight"), std::string::npos) << r.status();
  auto missing = load_adapter(**model, "/nonexistent/adapter");
  EXPECT_FALSE(missing.ok());
}

TEST(LoadErrors, LoraTargetsThatMatchNothing) {
  auto model = CausalLM::load(fixture_dir("llama"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok());
  LoraConfig c;
  c.target_modules = {"query_key_value"};
  absl::Status s = add_lora(**model, c, 0);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("query_key_value"), std::string::npos);
  c.target_modules = {"q_proj"};
  c.r = 0;
  EXPECT_FALSE(add_lora(**model, c, 0).ok());
}

// A fresh folder `dir` holding the qwen2 fixture adapter's weights; its adapter_config.json
// (returned) is for the test to edit and write there.
nlohmann::json qwen2_adapter_weights_in(const std::string& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(fixture_dir("qwen2") + "/adapter/adapter_model.safetensors", dir + "/adapter_model.safetensors");
  return nlohmann::json::parse(std::ifstream(fixture_dir("qwen2") + "/adapter/adapter_config.json"));
}

// An adapter whose adapter_config.json names modules the model does not have: the config is
// blamed (with the model's module names), not the weights file.
TEST(LoadErrors, AdapterTargetModulesThatMatchNothingBlameTheConfig) {
  auto model = CausalLM::load(fixture_dir("qwen2"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok());
  const std::string dir = ::testing::TempDir() + "loom_adapter_no_match";
  nlohmann::json cfg = qwen2_adapter_weights_in(dir);
  cfg["target_modules"] = {"query_key_value", "dense"};
  std::ofstream(dir + "/adapter_config.json") << cfg.dump();
  auto r = load_adapter(**model, dir);
  ASSERT_FALSE(r.ok());
  const std::string msg(r.status().message());
  EXPECT_NE(msg.find("adapter_config.json: target_modules [query_key_value, dense] match no module"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("q_proj"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("adapter_model.safetensors"), std::string::npos) << msg;
}

// An adapter_config.json without "r" or "target_modules" says which field is missing (not a JSON
// library's message), and one whose r disagrees with its tensors names r and the file it came from.
TEST(LoadErrors, AdapterConfigFieldsAreNamed) {
  auto model = CausalLM::load(fixture_dir("qwen2"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok());
  const std::string dir = ::testing::TempDir() + "loom_adapter_fields";
  const nlohmann::json cfg = qwen2_adapter_weights_in(dir);
  for (const char* key : {"r", "target_modules"}) {
    nlohmann::json c = cfg;
    c.erase(key);
    std::ofstream(dir + "/adapter_config.json") << c.dump();
    auto r = load_adapter(**model, dir);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(std::string(r.status().message()).find(std::string("adapter_config.json: missing field \"") + key + "\""),
              std::string::npos)
        << r.status();
  }
  nlohmann::json c = cfg;
  c["r"] = cfg["r"].get<int>() * 2;
  std::ofstream(dir + "/adapter_config.json") << c.dump();
  auto r = load_adapter(**model, dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find(absl::StrCat("(r = ", c["r"].get<int>(), " from ")), std::string::npos)
      << r.status();
}

// A weight stored as integers is refused when the model loads, naming the tensor.
TEST(LoadErrors, IntegerWeightIsRefusedAtLoad) {
  const std::string dir = broken_copy("llama", "int_weight", [](auto& t) {
    Tensor& w = t.at("model.layers.0.self_attn.k_proj.weight");
    std::vector<int32_t> ints(static_cast<size_t>(w.numel()), 1);
    w = Tensor::from_ints(ints, w.shape());
  });
  expect_error(dir, {"model.layers.0.self_attn.k_proj.weight", "i32", "float"});
}

// The path itself: empty, a Hugging Face model id, training data or a bare weights file given as
// the model. Each says what Loom expected and what the path is.
TEST(LoadErrors, ModelPathsOfTheWrongKindSayWhatTheyAre) {
  expect_error("", {"the model path is empty", "a .gguf file"});
  expect_error("HuggingFaceTB/SmolLM2-135M-Instruct",
               {"looks like a Hugging Face model id", "huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct"});
  const std::string jsonl = ::testing::TempDir() + "loom_model_is_data.jsonl";
  std::ofstream(jsonl) << "{\"text\": \"hello\"}\n{\"text\": \"world\"}\n";
  expect_error(jsonl, {jsonl + ": expected a Hugging Face model folder", "but this is a JSONL file"});
  expect_error(fixture_dir("llama") + "/model.safetensors", {"but this is a safetensors file", "give the folder"});
  expect_error(fixture_dir("llama") + "/config.json", {"but this is a JSON file"});
}

TEST(Lora, AdapterOnOneLayerSavesFullModuleNamesAndReloads) {
  auto model = CausalLM::load(fixture_dir("llama"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok());
  LoraConfig c;
  c.r = 2;
  c.target_modules = {"model.layers.1.self_attn.q_proj"};
  ASSERT_TRUE(add_lora(**model, c, 1).ok());
  EXPECT_EQ(lora_parameters(**model).size(), 2u);
  const std::string out = ::testing::TempDir() + "loom_one_layer_adapter";
  ASSERT_TRUE(save_adapter(**model, c, out).ok());
  auto fresh = CausalLM::load(fixture_dir("llama"), {DType::f32, Device::cpu()});
  auto loaded = load_adapter(**fresh, out);
  ASSERT_TRUE(loaded.ok()) << loaded.status();  // short "q_proj" would have asked for layer 0 too
  EXPECT_EQ(lora_parameters(**fresh).size(), 2u);
}

TEST(Lora, FreshAdapterLeavesLogitsUnchangedAndInitsLikePeft) {
  auto base = CausalLM::load(fixture_dir("mistral"), {DType::f32, Device::cpu()});
  auto lora = CausalLM::load(fixture_dir("mistral"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(base.ok() && lora.ok());
  LoraConfig c;
  c.r = 4;
  ASSERT_TRUE(add_lora(**lora, c, 7).ok());
  auto in = read_all(fixture_dir("mistral") + "/inputs.safetensors");
  ag::NoGradGuard ng;
  // B = 0: the adapter adds exactly nothing.
  EXPECT_EQ(rel_err((*lora)->forward(in["input_ids"]).value(), (*base)->forward(in["input_ids"]).value()), 0.0);
  for (auto& [name, v] : lora_parameters(**lora)) {
    const auto x = v->value().to_floats();
    if (name.ends_with("lora_B.weight")) {
      for (float f : x) ASSERT_EQ(f, 0.f) << name;
    } else {  // U(-1/sqrt(in), 1/sqrt(in)): in = 64 or 96 here
      const float bound = 1.f / std::sqrt(static_cast<float>(v->size(1)));
      float lo = 0, hi = 0;
      for (float f : x) lo = std::min(lo, f), hi = std::max(hi, f);
      EXPECT_LE(hi, bound) << name;
      EXPECT_GE(lo, -bound) << name;
      EXPECT_GT(hi, 0.8f * bound) << name;  // the range is actually used
    }
  }
}

}  // namespace
}  // namespace loom::test
