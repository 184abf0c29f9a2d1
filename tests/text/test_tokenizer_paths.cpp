// Tokenizer::load on hostile paths and ids: an empty path, a Hugging Face model id, training data
// given as the model, and token ids far beyond any vocabulary (which would size the id tables) are
// errors naming the path or token, never a crash or an allocation of gigabytes.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <string>

#include "nlohmann/json.hpp"
#include "text/tokenizer.h"

namespace loom {
namespace {

const std::string kTok = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/tokenizers/qwen2/tokenizer.json";

void expect_has(const absl::Status& s, const std::vector<std::string>& parts) {
  ASSERT_FALSE(s.ok());
  for (const auto& p : parts) EXPECT_NE(s.message().find(p), std::string::npos) << "'" << p << "' not in: " << s;
}

TEST(TokenizerPaths, EmptyAndHubIdPaths) {
  expect_has(Tokenizer::load("").status(), {"path is empty", "a model folder, a .gguf file or a tokenizer.json"});
  expect_has(Tokenizer::load("HuggingFaceTB/SmolLM2-135M-Instruct").status(),
             {"Hugging Face model id", "huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir DIR"});
}

TEST(TokenizerPaths, JsonlGivenAsTheModelIsNamedAsSuch) {
  const std::string data = ::testing::TempDir() + "loom_tok_is_data.jsonl";
  std::ofstream(data) << "{\"messages\": []}\n{\"messages\": []}\n";
  expect_has(Tokenizer::load(data).status(), {data + ": expected a model folder, a .gguf file or a tokenizer.json",
                                              "this is a JSONL file"});
  EXPECT_TRUE(Tokenizer::load(kTok).ok());  // a real tokenizer.json is still JSON
}

// Edits the qwen2 fixture's tokenizer.json and loads it.
absl::Status load_edited(const std::string& tag, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(kTok));
  edit(j);
  const std::string p = ::testing::TempDir() + "loom_tok_" + tag + ".json";
  std::ofstream(p) << j.dump();
  return Tokenizer::load(p).status();
}

TEST(TokenizerPaths, HugeTokenIdsAreRefusedBeforeSizingTables) {
  expect_has(load_edited("vocab_id", [](auto& j) { j["model"]["vocab"]["hello"] = 1000000000; }),
             {"model.vocab[\"hello\"]: id 1000000000 is beyond any real vocabulary", "below 4194304"});
  expect_has(load_edited("added_id", [](auto& j) { j["added_tokens"][0]["id"] = 1000000000; }),
             {"added_tokens: \"", "has id 1000000000, beyond any real vocabulary"});
  // The largest allowed id loads (tables of 4 M entries stay cheap).
  EXPECT_TRUE(load_edited("max_id", [](auto& j) { j["model"]["vocab"]["hello"] = (1 << 22) - 1; }).ok());
}

}  // namespace
}  // namespace loom
