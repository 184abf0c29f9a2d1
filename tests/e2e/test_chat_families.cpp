// `loom generate --chat --system` on a folder of each newer family with its models' published chat
// template (tests/fixtures/chat/templates): the prompt the model is given (--show-prompt, its tokens
// decoded, and counted) is the text transformers renders for the same two messages (cases.json "prompt_system",
// tools/reference/make_chat_template_fixtures.py): Gemma 3 folds the system message into the first user turn
// after <bos>, Phi-3.5 writes <|system|>/<|user|> turns closed by <|end|> and opens <|assistant|>,
// Phi-4 uses <|im_start|>role<|im_sep|>...<|im_end|>. The folders are the tiny fixtures with a
// character-level byte-level BPE tokenizer (printable ASCII and newline, the template's special
// tokens at the ids the fixture's config names) that fits their 128-token vocabulary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "nlohmann/json.hpp"
#include "tests/e2e/cli.h"
#include "tests/models/fixtures.h"
#include "tests/temp_dir.h"

namespace loom::test {
namespace {

using nlohmann::json;

std::string src_dir() { return LOOM_SOURCE_DIR; }

// GPT-2's byte-to-character map for the bytes the prompts use: printable ASCII as itself, space and
// newline as U+0120 and U+010A.
std::string byte_char(int b) {
  if (b == ' ') return "\xC4\xA0";
  if (b == '\n') return "\xC4\x8A";
  return std::string(1, static_cast<char>(b));
}

json tokenizer_json(const std::vector<std::string>& specials) {
  json vocab = json::object(), added = json::array();
  for (size_t i = 0; i < specials.size(); ++i) {
    vocab[specials[i]] = i;
    added.push_back({{"id", i}, {"content", specials[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  int64_t id = static_cast<int64_t>(specials.size());
  for (int b = 0x21; b <= 0x7E; ++b) vocab[byte_char(b)] = id++;
  vocab[byte_char(' ')] = id++;
  vocab[byte_char('\n')] = id++;
  EXPECT_LE(id, 128);
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", nullptr},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
            {"vocab", vocab}, {"merges", json::array()}}}};
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// transformers' rendering of [system, user] with a generation prompt for `tmpl`.
json prompt_system_case(const std::string& tmpl) {
  for (const json& c : read_json(src_dir() + "/tests/fixtures/chat/cases.json"))
    if (c["template"] == tmpl && c["name"] == "prompt_system" && c["add_generation_prompt"] == true) return c;
  ADD_FAILURE() << "no prompt_system case for " << tmpl;
  return {};
}

// The tokens `text` is with this tokenizer: one per special token, one per other byte.
size_t token_count(const std::string& text, const std::vector<std::string>& specials) {
  size_t n = 0;
  for (size_t i = 0; i < text.size(); ++n) {
    size_t step = 1;
    for (const std::string& s : specials)
      if (text.compare(i, s.size(), s) == 0) step = s.size();
    i += step;
  }
  return n;
}

// What `loom generate --chat` shows between the --show-prompt markers, with the token count it
// gives in *tokens.
std::string shown_prompt(const std::string& model, const json& c, size_t* tokens) {
  const auto& m = c["messages"];
  RunResult r = run_loom("generate --model " + model + " --system '" + m[0]["content"].get<std::string>() + "' --chat '" +
                         m[1]["content"].get<std::string>() + "' --temperature 0 --max-new-tokens 4 --show-prompt");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string open = "loom generate: the prompt (", close = "\nloom generate: end of the prompt\n";
  const size_t a = r.output.find(open), b = r.output.find(close);
  if (a == std::string::npos || b == std::string::npos) {
    ADD_FAILURE() << r.output;
    return "";
  }
  *tokens = std::stoul(r.output.substr(a + open.size()));
  const size_t text = r.output.find('\n', a) + 1;
  return r.output.substr(text, b - text);
}

struct Case {
  std::string fixture, tmpl;
  std::vector<std::string> specials;  // ids 0.. (the fixture's bos/eos/pad ids among them)
};

TEST(ChatFamilies, GeneratePromptIsTheTemplatesRendering) {
  const std::vector<Case> cases = {
      {"gemma3", "gemma3", {"<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"}},
      {"phi3", "phi3_5", {"<unk>", "<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"}},
      {"phi3", "phi4", {"<|dummy_0|>", "<|endoftext|>", "<|im_end|>", "<|im_start|>", "<|im_sep|>"}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.tmpl);
    const json c = prompt_system_case(k.tmpl);
    TempDir dir("loom_chat_" + k.tmpl);
    copy_fixture(k.fixture, dir.path(), json::object());
    std::ofstream(dir.file("tokenizer.json")) << tokenizer_json(k.specials).dump();
    json config = {{"chat_template", read_text(src_dir() + "/tests/fixtures/chat/templates/" + k.tmpl + ".jinja")},
                   {"eos_token", c["eos_token"]}, {"tokenizer_class", "PreTrainedTokenizerFast"}};
    if (!c["bos_token"].is_null()) config["bos_token"] = c["bos_token"];
    std::ofstream(dir.file("tokenizer_config.json")) << config.dump();
    size_t tokens = 0;
    EXPECT_EQ(shown_prompt(dir.path(), c, &tokens), c["text"].get<std::string>());
    EXPECT_EQ(tokens, token_count(c["text"], k.specials));  // the markers are special tokens, not spelled out
  }
}

// The template travels in `loom export`'s file (tokenizer.chat_template): the Gemma 3 fixture as
// llama.cpp's gemma3 holds it, exported and chatted with, renders the same prompt.
TEST(ChatFamilies, Gemma3TemplateSurvivesGgufExport) {
  const json c = prompt_system_case("gemma3");
  TempDir dir("loom_chat_gemma3_gguf");
  copy_fixture("gemma3", dir.path(), gemma3_llama_cpp_patch());
  std::ofstream(dir.file("tokenizer.json"))
      << tokenizer_json({"<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"}).dump();
  std::ofstream(dir.file("tokenizer_config.json"))
      << json({{"chat_template", read_text(src_dir() + "/tests/fixtures/chat/templates/gemma3.jinja")},
               {"bos_token", "<bos>"}, {"eos_token", "<eos>"}, {"pad_token", "<pad>"}})
             .dump();
  const std::string gguf = dir.file("g.gguf");
  RunResult r = run_loom("export --model " + dir.path() + " --out " + gguf + " --type f16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  size_t tokens = 0;
  EXPECT_EQ(shown_prompt(gguf, c, &tokens), c["text"].get<std::string>());
  EXPECT_EQ(tokens, token_count(c["text"], {"<bos>", "<start_of_turn>", "<end_of_turn>"}));
}

}  // namespace
}  // namespace loom::test
