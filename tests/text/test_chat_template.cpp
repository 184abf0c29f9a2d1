// Chat templates against transformers: tests/fixtures/chat/cases.json holds what
// apply_chat_template(tokenize=False) renders with each family's official Jinja template
// (tools/make_chat_fixtures.py) and the assistant spans derived there; render_chat must match byte
// for byte, and fail where the template raises.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "train/data.h"

namespace loom {
namespace {

const std::string kChatDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/chat";

nlohmann::json load_cases() {
  std::ifstream f(kChatDir + "/cases.json");
  EXPECT_TRUE(f.good()) << "missing " << kChatDir << "/cases.json (run tools/make_chat_fixtures.py)";
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

TEST(ChatTemplate, MatchesTransformersByteForByte) {
  const nlohmann::json cases = load_cases();
  ASSERT_GE(cases.size(), 30u);
  int rendered = 0, raised = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c["template"].get<std::string>() + "/" + c["name"].get<std::string>());
    auto tmpl = parse_chat_template(c["template"].get<std::string>());
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    std::vector<ChatMessage> messages;
    for (const auto& m : c["messages"]) messages.push_back({m["role"], m["content"]});
    auto r = render_chat(*tmpl, messages, c["add_generation_prompt"].get<bool>());
    if (c.contains("error")) {
      EXPECT_FALSE(r.ok()) << "transformers raised: " << c["error"];
      ++raised;
      continue;
    }
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->text, c["text"].get<std::string>());
    std::vector<std::pair<size_t, size_t>> spans;
    for (const auto& s : c["train_spans"]) spans.emplace_back(s[0].get<size_t>(), s[1].get<size_t>());
    EXPECT_EQ(r->train_spans, spans);
    ++rendered;
  }
  EXPECT_GT(rendered, 40);
  EXPECT_GE(raised, 1);
}

TEST(ChatTemplate, SpansCoverAssistantContentAndEndMarker) {
  const std::vector<ChatMessage> m = {{"user", "hi"}, {"assistant", " yo "}, {"user", "x"}, {"assistant", "z"}};
  struct Want {
    ChatTemplate t;
    std::vector<std::string> spans;
  };
  for (const Want& w : {Want{ChatTemplate::kChatML, {" yo <|im_end|>", "z<|im_end|>"}},
                        Want{ChatTemplate::kLlama3, {"yo<|eot_id|>", "z<|eot_id|>"}},
                        Want{ChatTemplate::kGemma, {"yo<end_of_turn>", "z<end_of_turn>"}}}) {
    auto r = render_chat(w.t, m);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->train_spans.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const auto [b, e] = r->train_spans[i];
      EXPECT_EQ(r->text.substr(b, e - b), w.spans[i]);
    }
  }
}

TEST(ChatTemplate, Errors) {
  EXPECT_FALSE(render_chat(ChatTemplate::kChatML, {}).ok());
  auto bad = render_chat(ChatTemplate::kLlama3, {{"user", "a"}, {"robot", "b"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("robot"), std::string::npos) << bad.status();
  auto alt = render_chat(ChatTemplate::kGemma, {{"assistant", "a"}});
  ASSERT_FALSE(alt.ok());
  EXPECT_NE(alt.status().message().find("alternate"), std::string::npos) << alt.status();
  auto unknown = parse_chat_template("vicuna");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("vicuna"), std::string::npos);
  EXPECT_EQ(*parse_chat_template("chatml"), ChatTemplate::kChatML);
  EXPECT_EQ(*parse_chat_template("llama3"), ChatTemplate::kLlama3);
  EXPECT_EQ(*parse_chat_template("gemma"), ChatTemplate::kGemma);
}

class DetectTemplate : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("loom_detect_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  std::filesystem::path dir_;
};

TEST_F(DetectTemplate, FromTokenizerConfigThenModelType) {
  write("tokenizer_config.json", R"({"chat_template": "{{ '<start_of_turn>' + role }}"})");
  write("config.json", R"({"model_type": "llama"})");
  EXPECT_EQ(*detect_chat_template(dir_.string()), ChatTemplate::kGemma);  // the template text wins
  write("tokenizer_config.json", R"({"chat_template": [{"name": "default", "template": "<|im_start|>"}]})");
  EXPECT_EQ(*detect_chat_template(dir_.string()), ChatTemplate::kChatML);
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  EXPECT_EQ(*detect_chat_template(dir_.string()), ChatTemplate::kLlama3);
  write("config.json", R"({"model_type": "qwen3"})");
  EXPECT_EQ(*detect_chat_template(dir_.string()), ChatTemplate::kChatML);
  write("config.json", R"({"model_type": "gemma2"})");
  EXPECT_EQ(*detect_chat_template(dir_.string()), ChatTemplate::kGemma);
  write("config.json", R"({"model_type": "gpt2"})");
  auto r = detect_chat_template(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("gpt2"), std::string::npos) << r.status();
}

TEST_F(DetectTemplate, MissingFilesNameTheFolder) {
  auto r = detect_chat_template(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(dir_.string()), std::string::npos) << r.status();
}

}  // namespace
}  // namespace loom
