// Training-data shapes against transformers (tests/fixtures/chat/data_cases.json, made by
// tools/reference/make_chat_template_fixtures.py): Alpaca, ShareGPT and tool-call lines become the documented
// conversation, render byte for byte as apply_chat_template does and train on the same spans; the
// classic Alpaca prompt without a template; errors naming file, line and key; lazy templates.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "train/data.h"
#include "train/data_formats.h"

namespace loom {
namespace {

using Json = nlohmann::ordered_json;
const std::string kChatDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/chat";
const std::string kTokDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/tokenizers";

std::string read(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "missing " << path << " (run tools/reference/make_chat_template_fixtures.py)";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::optional<std::string> opt_string(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  return std::nullopt;
}

ChatTemplate fixture(const std::string& name, ChatSpecialTokens tokens) {
  auto t = ChatTemplate::from_source(read(kChatDir + "/templates/" + name + ".jinja"), name, std::move(tokens));
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

const Tokenizer& qwen_tok() {
  static const Tokenizer* t = [] {
    auto r = Tokenizer::load(kTokDir + "/qwen2/tokenizer.json");
    EXPECT_TRUE(r.ok()) << r.status();
    return new Tokenizer(*std::move(r));
  }();
  return *t;
}

// A message as the template receives it, for comparing with the fixture's (key order aside).
nlohmann::json as_json(const ChatMessage& m) {
  nlohmann::json j = {{"role", m.role}, {"content", m.content}};
  for (const auto& [k, v] : m.extra.items()) j[k] = nlohmann::json::parse(v.dump());
  return j;
}

absl::StatusOr<Conversation> conversation_of(const Json& line) {
  if (line.contains("conversations")) return sharegpt_conversation(line);
  if (line.contains("messages")) return messages_conversation(line);
  auto r = alpaca_record(line);
  if (!r.ok()) return r.status();
  return alpaca_conversation(*r);
}

class TempFiles : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const auto path = std::filesystem::temp_directory_path() /
                      (std::string("loom_formats_") + info->name() + "_" + std::to_string(paths_.size()) + ".jsonl");
    std::ofstream(path, std::ios::binary) << text;
    paths_.push_back(path);
    return path.string();
  }
  void TearDown() override {
    for (const auto& p : paths_) std::filesystem::remove(p);
  }
  std::vector<std::filesystem::path> paths_;
};

TEST(DataFormats, MatchTransformersRenderingAndSpans) {
  const Json cases = Json::parse(read(kChatDir + "/data_cases.json"));
  ASSERT_GE(cases.size(), 35u);
  int tool_cases = 0;
  for (const auto& c : cases) {
    const std::string name = c["template"].get<std::string>() + "/" + c["name"].get<std::string>();
    SCOPED_TRACE(name);
    const ChatTemplate t = fixture(c["template"], {opt_string(c["bos_token"]), opt_string(c["eos_token"]), {}, {},
                                                   /*none_when_missing=*/true});
    auto conv = conversation_of(c["line"]);
    ASSERT_TRUE(conv.ok()) << conv.status();
    // The conversion is the documented one (written independently in the fixture script).
    ASSERT_EQ(conv->messages.size(), c["messages"].size());
    for (size_t i = 0; i < conv->messages.size(); ++i)
      EXPECT_EQ(as_json(conv->messages[i]), nlohmann::json::parse(c["messages"][i].dump())) << "message " << i;
    auto r = t.render(conv->messages, false, conv->tools);
    ASSERT_FALSE(c.contains("error")) << c["error"];
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->text, c["text"].get<std::string>());
    if (c["train_spans"].is_null()) continue;
    std::vector<std::pair<size_t, size_t>> spans;
    for (const auto& s : c["train_spans"]) spans.emplace_back(s[0].get<size_t>(), s[1].get<size_t>());
    EXPECT_EQ(r->train_spans, spans);
    tool_cases += conv->tools.is_array();

    // load_jsonl's loss mask: the tokens inside the spans, nothing else.
    DataOptions opt;
    opt.chat_template = t;
    const auto path = std::filesystem::temp_directory_path() / "loom_formats_case.jsonl";
    std::ofstream(path) << c["line"].dump() << "\n";
    auto ex = load_jsonl(path.string(), qwen_tok(), opt, nullptr);
    std::filesystem::remove(path);
    ASSERT_TRUE(ex.ok()) << ex.status();
    std::vector<std::pair<size_t, size_t>> offsets;
    const auto ids = qwen_tok().encode_with_offsets(c["text"].get<std::string>(), false, &offsets);
    EXPECT_EQ((*ex)[0].ids, ids);
    int targets = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      bool inside = false;
      for (auto [b, e] : spans) inside |= offsets[i].second > offsets[i].first && offsets[i].first >= b && offsets[i].second <= e;
      EXPECT_EQ((*ex)[0].target[i], inside ? 1 : 0) << "token " << i;
      targets += inside;
    }
    EXPECT_GT(targets, 0);
  }
  EXPECT_GE(tool_cases, 9);
}

// Stanford Alpaca's prompt with Axolotl's/Unsloth's newline after "### Response:", spelled out here.
TEST_F(TempFiles, AlpacaWithoutTemplateUsesTheClassicPrompt) {
  const std::string path = write(
      R"({"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"})" "\n"
      R"({"instruction": "Name a colour.", "output": "Red.", "input": null})" "\n"
      R"({"instruction": "Add.", "input": "", "output": "5", "system": "You are a calculator."})" "\n");
  const std::string with_input =
      "Below is an instruction that describes a task, paired with an input that provides further context. Write a "
      "response that appropriately completes the request.\n\n### Instruction:\nTranslate to French.\n\n### "
      "Input:\nGood morning\n\n### Response:\n";
  const std::string no_input =
      "Below is an instruction that describes a task. Write a response that appropriately completes the "
      "request.\n\n### Instruction:\nName a colour.\n\n### Response:\n";
  const std::string system = "You are a calculator.\n\n### Instruction:\nAdd.\n\n### Response:\n";
  const Tokenizer& tok = qwen_tok();
  // No template chosen, and the ChatML fallback of a model without one: both the classic prompt.
  DataOptions fallback;
  std::string note;
  fallback.chat_template = training_chat_template(kTokDir + "/qwen2", "", &note);
  ASSERT_TRUE(fallback.chat_template.ok() && fallback.chat_template->is_fallback()) << note;
  for (const DataOptions& opt : {DataOptions{}, fallback}) {
    DataStats st;
    auto r = load_jsonl(path, tok, opt, &st);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(st.conversations, 0);
    const std::pair<std::string, std::string> want[] = {{with_input, "Bonjour"}, {no_input, "Red."}, {system, "5"}};
    for (size_t k = 0; k < 3; ++k) {
      std::vector<int32_t> ids = tok.encode(want[k].first, true);
      std::vector<uint8_t> target(ids.size(), 0);
      for (int32_t id : tok.encode(want[k].second, false)) ids.push_back(id), target.push_back(1);
      ids.push_back(*tok.eos_id());
      target.push_back(1);
      EXPECT_EQ((*r)[k].ids, ids) << k;
      EXPECT_EQ((*r)[k].target, target) << k;
    }
  }
  // --chat-template chatml chosen explicitly: the chat rendering.
  DataOptions chatml;
  chatml.chat_template = parse_chat_template("chatml");
  DataStats st;
  auto r = load_jsonl(path, tok, chatml, &st);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(st.conversations, 3);
  EXPECT_EQ(tok.decode((*r)[0].ids),
            "<|im_start|>user\nTranslate to French.\nGood morning<|im_end|>\n<|im_start|>assistant\nBonjour<|im_end|>\n");
}

TEST_F(TempFiles, NewShapesErrorsNameFileLineAndKey) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"conversations": [{"from": "narrator", "value": "x"}]})", "conversations[0].from is \"narrator\""},
      {R"({"conversations": [{"from": "human"}]})", "conversations[0] has no \"value\""},
      {R"({"conversations": [{"from": "human", "value": 3}]})", "conversations[0]: \"value\" must be a string, got number"},
      {R"({"conversations": {"from": "human"}})", "\"conversations\" must be an array, got object"},
      {R"({"conversations": [{"from": "function_call", "value": "not json"}]})", "must be JSON"},
      {R"({"instruction": "x"})", "the Alpaca line has no \"output\""},
      {R"({"output": "x"})", "the Alpaca line has no \"instruction\""},
      {R"({"instruction": "x", "output": 5})", "\"output\" must be a string, got number"},
      {R"({"instruction": "x", "output": "y", "input": ["z"]})", "\"input\" must be a string, got array"},
      {R"({"instruction": "x", "output": "y", "text": "z"})", "ambiguous shape"},
      {R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})", "only assistant messages call tools"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}]})",
       "messages[0].tool_calls[0].function has no \"name\""},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]})",
       "arguments must be an object or a JSON string, got number"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}})", "\"tools\" must be an array"},
  };
  DataOptions opt;
  opt.chat_template = parse_chat_template("chatml");
  for (const auto& [line, what] : bad) {
    SCOPED_TRACE(line);
    const std::string path = write("{\"text\": \"fine\"}\n" + line + "\n");
    auto r = load_jsonl(path, qwen_tok(), opt, nullptr);
    ASSERT_FALSE(r.ok());
    const std::string msg(r.status().message());
    EXPECT_NE(msg.find(path + ":2: "), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
  // With --skip-bad-lines each is counted.
  std::string all = "{\"text\": \"fine\"}\n";
  for (const auto& [line, what] : bad) all += line + "\n";
  opt.skip_bad_lines = true;
  DataStats st;
  auto r = load_jsonl(write(all), qwen_tok(), opt, &st);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(st.skipped, static_cast<int64_t>(bad.size()));
  EXPECT_EQ(st.examples, 1);
}

TEST_F(TempFiles, TemplateWithoutToolSupportSaysSo) {
  const std::string path = write(
      R"({"messages": [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", )"
      R"("tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}, )"
      R"({"role": "user", "content": "ok"}, {"role": "assistant", "content": "fine"}]})" "\n");
  DataOptions opt;
  opt.chat_template = fixture("gemma2", {.bos_token = "<bos>", .eos_token = "<eos>"});
  auto r = load_jsonl(path, qwen_tok(), opt, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path + ":1: gemma2 does not render tool calls"), std::string::npos) << r.status();
}

// A broken template stops nothing until a line needs it; then it names the template and the line,
// and under --skip-bad-lines it is said once with a count.
TEST_F(TempFiles, BrokenTemplateOnlyMattersForConversations) {
  DataOptions opt;
  opt.chat_template = ChatTemplate::from_source("{% if %}", "model/chat_template.jinja");
  ASSERT_FALSE(opt.chat_template.ok());
  const std::string plain = write("{\"text\": \"a\"}\n{\"prompt\": \"p\", \"completion\": \"c\"}\n");
  auto ok = load_jsonl(plain, qwen_tok(), opt, nullptr);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size(), 2u);

  const std::string mixed = write(
      "{\"text\": \"a\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}]}\n"
      "{\"conversations\": [{\"from\": \"human\", \"value\": \"u\"}]}\n{\"instruction\": \"i\", \"output\": \"o\"}\n");
  auto bad = load_jsonl(mixed, qwen_tok(), opt, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(mixed + ":2: the chat template cannot be used: model/chat_template.jinja"),
            std::string::npos)
      << bad.status();
  opt.skip_bad_lines = true;
  DataStats st;
  auto skipped = load_jsonl(mixed, qwen_tok(), opt, &st);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(st.examples, 1);
  EXPECT_EQ(st.skipped, 3);
  EXPECT_EQ(st.template_skipped, 3);
  EXPECT_EQ(st.template_error.rfind(mixed + ":2: the chat template cannot be used: model/chat_template.jinja", 0), 0u)
      << st.template_error;
}

}  // namespace
}  // namespace loom
