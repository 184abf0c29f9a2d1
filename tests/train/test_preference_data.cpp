// TRL's preference formats read into (prompt, chosen, rejected) token lists: the standard strings
// with EOS appended, conversations rendered with a real chat template (Qwen2.5's, whose renders
// tests/fixtures/chat checks against transformers), TRL's implicit prompt, truncation, and bad lines
// named by file and line.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tests/temp_dir.h"
#include "train/preference_data.h"

namespace loom::test {
namespace {

const std::string kFixtures = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures";

const Tokenizer& qwen() {
  static const Tokenizer* t = [] {
    auto r = Tokenizer::load(kFixtures + "/tokenizers/qwen2/tokenizer.json");
    EXPECT_TRUE(r.ok()) << r.status();
    return new Tokenizer(*std::move(r));
  }();
  return *t;
}

ChatTemplate qwen_template() {
  std::ifstream f(kFixtures + "/chat/templates/qwen2_5.jinja");
  std::stringstream ss;
  ss << f.rdbuf();
  auto t = ChatTemplate::from_source(ss.str(), "qwen2_5", {std::nullopt, std::string("<|im_end|>")});
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

std::string write(const TempDir& d, const std::string& text) {
  const std::string p = d.file("pairs.jsonl");
  std::ofstream(p) << text;
  return p;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(PreferenceData, StandardStringsGetEosAndSplitAtThePrompt) {
  TempDir d;
  PreferenceStats st;
  auto r = load_preference_jsonl(write(d, R"({"prompt": "The sky is", "chosen": " blue.", "rejected": " green."})"
                                          "\n\n"),
                                 qwen(), {}, &st);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  const PreferenceExample& e = (*r)[0];
  const int32_t eos = *qwen().eos_id();
  EXPECT_EQ(e.prompt, qwen().encode("The sky is", true));
  EXPECT_EQ(cat(e.prompt, e.chosen), qwen().encode("The sky is blue." + qwen().id_to_token(eos), true));
  EXPECT_EQ(e.chosen.back(), eos);
  EXPECT_EQ(e.rejected.back(), eos);
  EXPECT_EQ(st.pairs, 1);
  EXPECT_EQ(st.lines, 1);
}

TEST(PreferenceData, ConversationsUseTheChatTemplateAndTheImplicitPrompt) {
  TempDir d;
  PreferenceDataOptions o;
  o.chat_template = qwen_template();
  const std::string explicit_line =
      R"({"prompt": [{"role": "user", "content": "Capital of France?"}], "chosen": [{"role": "assistant", "content": "Paris."}], "rejected": [{"role": "assistant", "content": "Lyon."}]})";
  const std::string implicit_line =
      R"({"chosen": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}], "rejected": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Lyon."}]})";
  PreferenceStats st;
  auto r = load_preference_jsonl(write(d, explicit_line + "\n" + implicit_line + "\n"), qwen(), o, &st);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].prompt, (*r)[1].prompt);  // the implicit prompt is the shared user turn
  EXPECT_EQ((*r)[0].chosen, (*r)[1].chosen);
  auto rendered = o.chat_template->render({{"user", "Capital of France?"}}, true);
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ((*r)[0].prompt, qwen().encode(rendered->text));
  // The completion is the assistant turn and its end-of-turn marker.
  EXPECT_EQ(qwen().decode((*r)[0].chosen), "Paris.<|im_end|>\n");
  EXPECT_EQ(st.conversations, 2);
}

TEST(PreferenceData, TruncationKeepsThePromptEndAndTheCompletionStart) {
  TempDir d;
  PreferenceDataOptions o;
  o.max_prompt_len = 2;
  o.max_len = 4;
  PreferenceStats st;
  auto r = load_preference_jsonl(
      write(d, R"({"prompt": "one two three four", "chosen": " five six seven", "rejected": " eight"})" "\n"
               R"({"chosen": "a b", "rejected": "a c"})" "\n"),
      qwen(), o, &st);
  ASSERT_TRUE(r.ok()) << r.status();
  const PreferenceExample& e = (*r)[0];
  const std::vector<int32_t> prompt = qwen().encode("one two three four", true), rest = qwen().encode(" five six seven");
  EXPECT_EQ(e.prompt, std::vector<int32_t>(prompt.end() - 2, prompt.end()));
  EXPECT_EQ(e.chosen, std::vector<int32_t>(rest.begin(), rest.begin() + 2));
  EXPECT_EQ(st.truncated, 1);
  EXPECT_EQ(st.pairs, 2);
  o.max_len = 2;  // the first prompt alone fills it: dropped as TRL drops it
  r = load_preference_jsonl(write(d, R"({"prompt": "one two three four", "chosen": " x", "rejected": " y"})" "\n"
                                     R"({"prompt": "a", "chosen": " x", "rejected": " y"})" "\n"),
                            qwen(), o, &st);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(st.dropped_too_long, 1);
  EXPECT_EQ(r->size(), 1u);
}

TEST(PreferenceData, BadLinesAreNamedOrSkipped) {
  TempDir d;
  const std::string good = R"({"prompt": "p", "chosen": " a", "rejected": " b"})";
  const std::string path =
      write(d, good + "\n" + R"({"prompt": "p", "chosen": " a"})" + "\n" + "{broken\n" +
                   R"({"prompt": "p", "chosen": " a", "rejected": [{"role": "assistant", "content": "b"}]})" + "\n");
  auto r = load_preference_jsonl(path, qwen(), {}, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("pairs.jsonl:2: a preference line needs \"chosen\" and \"rejected\""),
            std::string::npos)
      << r.status();
  PreferenceDataOptions o;
  o.skip_bad_lines = true;
  PreferenceStats st;
  r = load_preference_jsonl(path, qwen(), o, &st);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(st.skipped, 3);
  EXPECT_EQ(st.pairs, 1);
  // A conversational line without a chat template says so.
  r = load_preference_jsonl(
      write(d, R"({"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]})" "\n"),
      qwen(), {}, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(":1: the chat template cannot be used"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace loom::test
