// Tokenizer tests: every case in tests/fixtures/tokenizers/<name>/cases.json (made by the Hugging Face
// `tokenizers` library, tools/reference/make_tokenizer_fixtures.py) must give the same ids, offsets and decodes;
// load errors name the file. A disabled test measures encode throughput.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <ctime>
#include <unistd.h>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer.h"

namespace loom {
namespace {

using json = nlohmann::json;

std::string fixture(const std::string& name) { return std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/tokenizers/" + name; }

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

std::string temp_file(const std::string& name, const std::string& contents) {
  const auto path = std::filesystem::temp_directory_path() / ("loom_tok_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path) << contents;
  return path.string();
}

class FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTest, MatchesHuggingFaceTokenizers) {
  auto tok = Tokenizer::load(fixture(GetParam()));  // a folder holding tokenizer.json
  ASSERT_TRUE(tok.ok()) << tok.status();
  const json cases = read_json(fixture(GetParam()) + "/cases.json")["cases"];
  ASSERT_GT(cases.size(), 60u);
  int checked = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const bool add = c["add_special_tokens"];
    const auto expected = c["ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE(testing::Message() << GetParam() << " text=" << testing::PrintToString(text) << " add=" << add);
    std::vector<std::pair<size_t, size_t>> offsets;
    const auto ids = tok->encode_with_offsets(text, add, &offsets);
    ASSERT_EQ(ids, expected) << "tokens: " << c["tokens"].dump();
    EXPECT_EQ(tok->encode(text, add), expected);
    std::vector<std::pair<size_t, size_t>> want_offsets;
    for (const auto& o : c["offsets"]) want_offsets.emplace_back(o[0].get<size_t>(), o[1].get<size_t>());
    EXPECT_EQ(offsets, want_offsets);
    EXPECT_EQ(tok->decode(ids, false), c["decode"].get<std::string>());
    EXPECT_EQ(tok->decode(ids, true), c["decode_skip_special"].get<std::string>());
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(cases.size()));
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, FixtureTest, ::testing::Values("llama3", "qwen2", "llama2", "gemma"));

// The Metaspace pre-tokenizer (transformers' LlamaTokenizer writes it) in each prepend_scheme, split
// or not, over the llama2 vocabulary: ids, offsets and decodes from the tokenizers library
// (tools/reference/make_metaspace_cases.py).
TEST(Tokenizer, MetaspaceMatchesTokenizers) {
  json base = read_json(fixture("llama2") + "/tokenizer.json");
  base["normalizer"] = nullptr;
  base["decoder"]["decoders"].erase(3);  // Replace, ByteFallback, Fuse (no Strip)
  const json variants = read_json(fixture("metaspace_cases.json"))["variants"];
  ASSERT_EQ(variants.size(), 6u);
  for (const json& v : variants) {
    base["pre_tokenizer"] = v["pre_tokenizer"];
    const std::string path = temp_file("metaspace.json", base.dump());
    auto tok = Tokenizer::load(path);
    ASSERT_TRUE(tok.ok()) << tok.status();
    for (const json& c : v["cases"]) {
      const std::string text = c["text"];
      SCOPED_TRACE(testing::Message() << v["pre_tokenizer"].dump() << " text=" << testing::PrintToString(text));
      std::vector<std::pair<size_t, size_t>> offsets, want_offsets;
      EXPECT_EQ(tok->encode_with_offsets(text, false, &offsets), c["ids"].get<std::vector<int32_t>>());
      for (const auto& o : c["offsets"]) want_offsets.emplace_back(o[0].get<size_t>(), o[1].get<size_t>());
      EXPECT_EQ(offsets, want_offsets);
      EXPECT_EQ(tok->decode(c["ids"].get<std::vector<int32_t>>(), false), c["decode"].get<std::string>());
    }
  }
  base["pre_tokenizer"] = {{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}};
  auto bad = Tokenizer::load(temp_file("metaspace_bad.json", base.dump()));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("prepend_scheme 'sometimes'"), std::string::npos) << bad.status();
}

TEST(Tokenizer, VocabularyQueries) {
  auto llama3 = Tokenizer::load(fixture("llama3") + "/tokenizer.json");
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  EXPECT_EQ(llama3->kind(), Tokenizer::Kind::kByteLevelBpe);
  const auto bot = llama3->token_to_id("<|begin_of_text|>");
  ASSERT_TRUE(bot.has_value());
  EXPECT_EQ(llama3->bos_id(), bot);
  EXPECT_EQ(llama3->eos_id(), llama3->token_to_id("<|end_of_text|>"));
  EXPECT_TRUE(llama3->is_special(*bot));
  EXPECT_EQ(llama3->id_to_token(*bot), "<|begin_of_text|>");
  EXPECT_EQ(llama3->vocab_size(), *llama3->token_to_id("<|eot_id|>") + 1);  // added tokens come last
  const auto space_t = llama3->token_to_id("Ġt");
  ASSERT_TRUE(space_t.has_value());
  EXPECT_FALSE(llama3->is_special(*space_t));

  auto qwen = Tokenizer::load(fixture("qwen2"));
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_FALSE(qwen->bos_id().has_value());  // Qwen adds no BOS
  EXPECT_EQ(qwen->eos_id(), qwen->token_to_id("<|endoftext|>"));

  auto llama2 = Tokenizer::load(fixture("llama2"));
  ASSERT_TRUE(llama2.ok()) << llama2.status();
  EXPECT_EQ(llama2->kind(), Tokenizer::Kind::kSentencePieceBpe);
  EXPECT_EQ(llama2->bos_id(), 1);
  EXPECT_EQ(llama2->eos_id(), 2);
  EXPECT_EQ(llama2->token_to_id("<0x0A>"), 3 + 0x0A);

  auto gemma = Tokenizer::load(fixture("gemma"));
  ASSERT_TRUE(gemma.ok()) << gemma.status();
  EXPECT_EQ(gemma->bos_id(), gemma->token_to_id("<bos>"));
  EXPECT_EQ(gemma->eos_id(), gemma->token_to_id("<eos>"));
}

// Byte-level BPE loses nothing: random UTF-8 (including code points absent from the corpus)
// decodes back to itself.
TEST(Tokenizer, ByteLevelRoundTripsRandomText) {
  auto tok = Tokenizer::load(fixture("llama3"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"a", "b", "Z", " ", "  ", "\n", "\t", "'", "s", "1", "23", ".", "é", "中",
                                             "😀", "\u200d", "\r\n", "<|eot_id|>", "ll", "'LL", "\u3000"};
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    std::vector<std::pair<size_t, size_t>> offsets;
    const auto ids = tok->encode_with_offsets(s, false, &offsets);
    EXPECT_EQ(tok->decode(ids), s);
    ASSERT_EQ(offsets.size(), ids.size());
    for (const auto& [b, e] : offsets) EXPECT_TRUE(b <= e && e <= s.size());
  }
}

TEST(Tokenizer, LoadErrorsNameTheFile) {
  const std::string missing = "/nonexistent/loom/tokenizer.json";
  auto a = Tokenizer::load(missing);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find(missing), std::string::npos) << a.status();

  const std::string wordpiece = temp_file("wordpiece.json", R"({"model": {"type": "WordPiece", "vocab": {}}})");
  auto b = Tokenizer::load(wordpiece);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find(wordpiece), std::string::npos) << b.status();
  EXPECT_NE(b.status().message().find("WordPiece"), std::string::npos) << b.status();

  const std::string malformed = temp_file("malformed.json", R"({"model": {"type": "BPE", )");
  auto c = Tokenizer::load(malformed);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(malformed), std::string::npos) << c.status();

  const std::string regex = temp_file(
      "regex.json",
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
          "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated", "invert": false}})");
  auto d = Tokenizer::load(regex);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(regex), std::string::npos) << d.status();
  EXPECT_NE(d.status().message().find("\\w+"), std::string::npos) << d.status();

  const std::string merge = temp_file("merge.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})");
  auto e = Tokenizer::load(merge);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("merges[0]"), std::string::npos) << e.status();

  // Ids past int32 are refused, not wrapped (2^32 + 7 used to become 7, 2^40 became 0).
  const std::string wide_vocab = temp_file("wide_vocab.json", R"({"model": {"type": "BPE", "vocab": {"a": 4294967303}, "merges": []}})");
  auto f = Tokenizer::load(wide_vocab);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("model.vocab[a]: id 4294967303 is outside"), std::string::npos) << f.status();
  const std::string wide_added = temp_file(
      "wide_added.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                            "added_tokens": [{"content": "<s>", "id": 1099511627776, "special": true}]})");
  auto g = Tokenizer::load(wide_added);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("\"<s>\" has id 1099511627776, outside"), std::string::npos) << g.status();
  for (const auto& p : {wordpiece, malformed, regex, merge, wide_vocab, wide_added}) std::filesystem::remove(p);
}

// Gemma 3's file adds a Split on " " after a normalizer that already replaced every " ": a no-op,
// so the result must equal the fixture's (which has no pre-tokenizer).
TEST(Tokenizer, SplitOnReplacedSpaceIsANoOp) {
  json j = read_json(fixture("gemma") + "/tokenizer.json");
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}};
  const std::string path = temp_file("gemma3.json", j.dump());
  auto split = Tokenizer::load(path);
  ASSERT_TRUE(split.ok()) << split.status();
  auto plain = Tokenizer::load(fixture("gemma"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (const char* text : {"Hello world  twice", " lead", "<start_of_turn>user\nHi<end_of_turn>"})
    EXPECT_EQ(split->encode(text, true), plain->encode(text, true)) << text;
  std::filesystem::remove(path);
}

// Pseudo-English: corpus words in a seeded random order, so most pieces repeat as in real text.
std::string english_text(size_t bytes) {
  std::ifstream f(fixture("corpus.txt"));
  std::vector<std::string> words;
  for (std::string w; f >> w;)
    if (static_cast<unsigned char>(w[0]) < 0x80) words.push_back(w);
  std::mt19937 rng(1);
  std::string s;
  while (s.size() < bytes) {
    s += words[rng() % words.size()];
    s += (rng() % 12 == 0) ? ".\n" : " ";
  }
  return s;
}

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// Run with --gtest_also_run_disabled_tests; prints single-thread encode MB/s.
TEST(TokenizerBench, DISABLED_Throughput) {
  const std::string text = english_text(8 << 20);
  for (const char* name : {"llama3", "qwen2", "llama2", "gemma"}) {
    auto tok = Tokenizer::load(fixture(name));
    ASSERT_TRUE(tok.ok()) << tok.status();
    // Documents of ~4 KB, as a data loader would feed them.
    size_t n_tokens = 0;
    tok->encode(text.substr(0, 1 << 20));  // warm the cache
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_seconds();
    for (size_t i = 0; i < text.size(); i += 4096) n_tokens += tok->encode(std::string_view(text).substr(i, 4096)).size();
    const double cpu = thread_cpu_seconds() - c0;  // per-core figure, robust to a busy machine
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-7s %.1f MB/s per core (CPU time), %.1f MB/s wall, %.2f M tokens/s (%zu bytes -> %zu tokens)\n",
                name, text.size() / cpu / 1e6, text.size() / wall / 1e6, n_tokens / cpu / 1e6, text.size(), n_tokens);
  }
}

// A model folder without tokenizer.json, and a file that cannot be opened, say so (not a stream
// error about reading a directory).
TEST(Tokenizer, MissingFilesSayWhy) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "loom_tok_empty_model";
  std::filesystem::create_directories(dir);
  auto r = Tokenizer::load(dir.string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no tokenizer.json in this folder"), std::string::npos) << r.status();
  auto missing = Tokenizer::load("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("No such file or directory"), std::string::npos) << missing.status();
}

}  // namespace
}  // namespace loom
