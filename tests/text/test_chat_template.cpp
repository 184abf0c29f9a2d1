// Chat templates against transformers: tests/fixtures/chat/cases.json holds what
// apply_chat_template(tokenize=False) renders with real published templates (Qwen2.5, Qwen3,
// Llama 3.1, Llama 2, Mistral v0.3, Gemma 2 and 3, SmolLM2; tools/reference/make_chat_template_fixtures.py)
// and the assistant spans derived there by sentinel substitution; Loom's rendering must match byte
// for byte, spans included, and fail where the template raises. Then how a model's template is found.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "nlohmann/json.hpp"
#include "text/chat_template.h"

namespace loom {
namespace {

const std::string kChatDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/chat";

std::string read(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "missing " << path << " (run tools/reference/make_chat_template_fixtures.py)";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ChatTemplate fixture(const std::string& name, ChatSpecialTokens tokens) {
  auto t = ChatTemplate::from_source(read(kChatDir + "/templates/" + name + ".jinja"), name, std::move(tokens));
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

std::optional<std::string> opt_string(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  return std::nullopt;
}

TEST(ChatTemplate, MatchesTransformersByteForByte) {
  const nlohmann::json cases = nlohmann::json::parse(read(kChatDir + "/cases.json"));
  ASSERT_GE(cases.size(), 250u);
  int rendered = 0, raised = 0, with_spans = 0;
  std::set<std::string> templates;
  for (const auto& c : cases) {
    const std::string name = c["template"].get<std::string>();
    SCOPED_TRACE(name + "/" + c["name"].get<std::string>() + (c["add_generation_prompt"].get<bool>() ? "/agp" : ""));
    templates.insert(name);
    // The special tokens exactly as the fixture passed them (a None token is defined as None).
    const ChatTemplate t =
        fixture(name, {opt_string(c["bos_token"]), opt_string(c["eos_token"]), {}, {}, /*none_when_missing=*/true});
    std::vector<ChatMessage> messages;
    for (const auto& m : c["messages"]) messages.push_back({m["role"], m["content"]});
    auto r = t.render(messages, c["add_generation_prompt"].get<bool>());
    if (c.contains("error")) {
      ASSERT_FALSE(r.ok()) << "transformers raised: " << c["error"];
      EXPECT_NE(r.status().message().find("raise_exception: " + c["error"].get<std::string>()), std::string::npos)
          << r.status();
      ++raised;
      continue;
    }
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->text, c["text"].get<std::string>());
    ++rendered;
    if (c["train_spans"].is_null()) continue;
    std::vector<std::pair<size_t, size_t>> spans;
    for (const auto& s : c["train_spans"]) spans.emplace_back(s[0].get<size_t>(), s[1].get<size_t>());
    EXPECT_EQ(r->train_spans, spans);
    with_spans += !spans.empty();
  }
  EXPECT_EQ(templates.size(), 10u);
  EXPECT_GT(rendered, 200);
  EXPECT_GT(with_spans, 150);
  EXPECT_GE(raised, 20);
}

TEST(ChatTemplate, SpansCoverAssistantContentAndEndMarker) {
  const std::vector<ChatMessage> m = {{"user", "hi"}, {"assistant", " yo "}, {"user", "x"}, {"assistant", "z"}};
  struct Want {
    ChatTemplate t;
    std::vector<std::string> spans;
  };
  const Want wants[] = {
      {fixture("qwen2_5", {.eos_token = "<|im_end|>"}), {" yo <|im_end|>", "z<|im_end|>"}},
      {fixture("smollm2", {.eos_token = "<|im_end|>"}), {" yo <|im_end|>", "z<|im_end|>"}},
      {fixture("llama3_1", {.eos_token = "<|eot_id|>"}), {"yo<|eot_id|>", "z<|eot_id|>"}},
      {fixture("gemma2", {.eos_token = "<eos>"}), {"yo<end_of_turn>", "z<end_of_turn>"}},
      {fixture("llama2", {.bos_token = "<s>", .eos_token = "</s>"}), {"yo </s>", "z </s>"}},
      {fixture("mistral_v0_3", {.bos_token = "<s>", .eos_token = "</s>"}), {"yo</s>", "z</s>"}},
  };
  for (const Want& w : wants) {
    SCOPED_TRACE(w.t.origin());
    auto r = w.t.render(m, false);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->train_spans.size(), 2u) << r->text;
    for (size_t i = 0; i < 2; ++i) {
      const auto [b, e] = r->train_spans[i];
      EXPECT_EQ(r->text.substr(b, e - b), w.spans[i]);
    }
  }
  // Qwen3 keeps the reasoning of the turn after the last user message: that reply's span runs from
  // its reasoning to its end marker; the earlier reply's reasoning is dropped from the text.
  const ChatTemplate qwen3 = fixture("qwen3", {.eos_token = "<|im_end|>"});
  auto r = qwen3.render({{"user", "a"}, {"assistant", "<think>\nr1\n</think>\n\nA1"}, {"user", "b"},
                         {"assistant", "<think>\nr2\n</think>\n\nA2"}},
                        false);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->train_spans.size(), 2u);
  EXPECT_EQ(r->text.substr(r->train_spans[0].first, r->train_spans[0].second - r->train_spans[0].first),
            "A1<|im_end|>");
  EXPECT_EQ(r->text.substr(r->train_spans[1].first, r->train_spans[1].second - r->train_spans[1].first),
            "r2\n</think>\n\nA2<|im_end|>");
}

TEST(ChatTemplate, Errors) {
  const ChatTemplate chatml = *parse_chat_template("chatml");
  EXPECT_FALSE(chatml.render({}, false).ok());
  auto bad = chatml.render({{"user", "a"}, {"robot", "b"}}, false);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("robot"), std::string::npos) << bad.status();
  auto alt = fixture("gemma2", {}).render({{"assistant", "a"}}, false);
  ASSERT_FALSE(alt.ok());
  EXPECT_NE(alt.status().message().find("gemma2, line 1: raise_exception: Conversation roles must alternate"),
            std::string::npos)
      << alt.status();
  auto unknown = parse_chat_template("vicuna");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("vicuna"), std::string::npos) << unknown.status();
  auto missing = parse_chat_template("/nonexistent/x.jinja");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("No such file or directory"), std::string::npos) << missing.status();
  auto syntax = ChatTemplate::from_source("{% for m in messages %}\n{{ m.content | shout }}{% endfor %}", "mine");
  ASSERT_FALSE(syntax.ok());
  EXPECT_NE(syntax.status().message().find("mine, line 2: unknown or unsupported filter 'shout'"), std::string::npos)
      << syntax.status();
}

TEST(ChatTemplate, PlainChatML) {
  auto r = parse_chat_template("chatml")->render({{"user", "hi"}, {"assistant", "yo"}}, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>assistant\n");
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
  std::string render(const ChatTemplate& t) {
    auto r = t.render({{"user", "u"}, {"assistant", "a"}}, false);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->text : "";
  }
  std::filesystem::path dir_;
};

TEST_F(DetectTemplate, TheModelsOwnTemplate) {
  const std::string tmpl = "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{{ eos_token }}{% endfor %}";
  write("tokenizer_config.json", nlohmann::json{{"chat_template", tmpl},
                                                {"bos_token", {{"content", "<B>"}, {"lstrip", false}}},
                                                {"eos_token", "<E>"}}
                                     .dump());
  auto t = detect_chat_template(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(render(*t), "<B>[user:u]<E>[assistant:a]<E>");
  auto r = t->render({{"user", "u"}, {"assistant", "a"}}, false);
  // "a": the "]" printed after it is no end-of-turn marker, so the span stops at the content.
  EXPECT_EQ(r->train_spans, (std::vector<std::pair<size_t, size_t>>{{25, 26}}));
  // A list of named templates: the one named "default".
  write("tokenizer_config.json",
        nlohmann::json{{"chat_template", {{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}}}}
            .dump());
  EXPECT_EQ(render(*detect_chat_template(dir_.string())), "D");
  write("tokenizer_config.json", nlohmann::json{{"chat_template", {{{"name", "tool_use"}, {"template", "T"}}}}}.dump());
  auto no_default = detect_chat_template(dir_.string());
  ASSERT_FALSE(no_default.ok());
  EXPECT_NE(no_default.status().message().find("\"tool_use\""), std::string::npos) << no_default.status();
  // chat_template.jinja wins over tokenizer_config.json, as in transformers.
  write("chat_template.jinja", "J{{ messages|length }}");
  EXPECT_EQ(render(*detect_chat_template(dir_.string())), "J2");
}

TEST_F(DetectTemplate, GenerationConfigEosTokensEndTurns) {
  write("tokenizer_config.json",
        nlohmann::json{{"chat_template", "{% for m in messages %}{{ m.content }}<|turn_end|>\n{% endfor %}"},
                       {"eos_token", "<|eos|>"},
                       {"added_tokens_decoder", {{"7", {{"content", "<|turn_end|>"}}}, {"8", {{"content", "<|eos|>"}}}}}}
            .dump());
  write("generation_config.json", R"({"eos_token_id": [8, 7]})");
  auto t = detect_chat_template(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status();
  auto r = t->render({{"user", "u"}, {"assistant", "a"}}, false);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->train_spans.size(), 1u);
  EXPECT_EQ(r->text.substr(r->train_spans[0].first, r->train_spans[0].second - r->train_spans[0].first), "a<|turn_end|>");
}

TEST_F(DetectTemplate, ErrorsNameTheFileAndLine) {
  auto none = detect_chat_template(dir_.string());
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::IsNotFound(none.status()));
  EXPECT_NE(none.status().message().find(dir_.string()), std::string::npos) << none.status();
  write("tokenizer_config.json", nlohmann::json{{"chat_template", "ok\n{% for m in messages %}\n{% include 'x' %}{% endfor %}"}}.dump());
  auto bad = detect_chat_template(dir_.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tokenizer_config.json chat_template, line 3: unsupported tag"), std::string::npos)
      << bad.status();
  // Training falls back to ChatML only when the model has no template, saying so.
  std::string note;
  EXPECT_FALSE(training_chat_template(dir_.string(), "", &note).ok());
  std::filesystem::remove(dir_ / "tokenizer_config.json");
  auto fallback = training_chat_template(dir_.string(), "", &note);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_NE(note.find("plain ChatML"), std::string::npos) << note;
}

}  // namespace
}  // namespace loom
