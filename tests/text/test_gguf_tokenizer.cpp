// GGUF tokenizer metadata -> tokenizer.json / tokenizer_config.json: ids equal the GGUF token list,
// control tokens become special added tokens, the chat template and special tokens carry over, and
// Loom's own Tokenizer encodes with the result as BPE over the file's merges does (ids worked out by
// hand from tools/reference/make_gguf_fixtures.py's tiny vocabulary, and from the tokenizers library).
// SentencePiece ("llama") vocabularies: the tokenizer.json, ids, decodes and chat templates equal
// what transformers builds from the same GGUF (tools/reference/make_gguf_spm_reference.py); bad metadata is
// an error naming the key.
#include "text/gguf_tokenizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "engine/gguf_writer.h"
#include "tests/temp_dir.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace loom {
namespace {

const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/gguf/";

TEST(GgufTokenizer, ByteLevelBpeFromMetadata) {
  auto f = GgufFile::open(kDir + "tiny_llama.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  auto t = gguf_hf_tokenizer(*f);
  ASSERT_TRUE(t.ok()) << t.status();
  const auto& j = t->tokenizer_json;
  const auto tokens = *f->get_strings("tokenizer.ggml.tokens");
  ASSERT_EQ(j["model"]["vocab"].size(), tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) EXPECT_EQ(j["model"]["vocab"][tokens[id]], id) << tokens[id];
  EXPECT_EQ(j["model"]["merges"].size(), f->get_strings("tokenizer.ggml.merges")->size());
  EXPECT_EQ(j["model"]["merges"][2], "\xc4\xa0t he");  // "Ġt he"
  ASSERT_EQ(j["added_tokens"].size(), 3u);  // the three control tokens
  EXPECT_EQ(j["added_tokens"][1]["content"], "<|im_start|>");
  EXPECT_EQ(j["added_tokens"][1]["id"], 1);
  EXPECT_EQ(j["added_tokens"][1]["special"], true);
  // smollm: digits split one by one before the byte-level regex (as SmolLM2's tokenizer.json).
  EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][0]["type"], "Digits");
  const auto& c = t->tokenizer_config_json;
  EXPECT_EQ(c["bos_token"], "<|im_start|>");
  EXPECT_EQ(c["eos_token"], "<|im_end|>");
  EXPECT_EQ(c["pad_token"], "<|endoftext|>");
  EXPECT_EQ(c["model_max_length"], 128);
  EXPECT_EQ(c["add_bos_token"], false);
  EXPECT_EQ(c["chat_template"], *f->get_string("tokenizer.chat_template"));
  EXPECT_EQ(c["added_tokens_decoder"]["2"]["content"], "<|im_end|>");
}

TEST(GgufTokenizer, LoomEncodesWithTheConvertedFile) {
  auto f = GgufFile::open(kDir + "tiny_llama.gguf");
  ASSERT_TRUE(f.ok());
  auto t = gguf_hf_tokenizer(*f);
  ASSERT_TRUE(t.ok());
  test::TempDir dir("loom_ggtok");
  std::ofstream(dir.file("tokenizer.json")) << t->tokenizer_json.dump();
  auto tok = Tokenizer::load(dir.file("tokenizer.json"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  // "the cat" -> "the" "Ġcat"; "the": "h e" merges (t=22, he=38); "Ġcat": "a t" (rank 8) before
  // "Ġ c" (rank 17) gives Ġc=54, at=45. Specials match whole.
  EXPECT_EQ(tok->encode("the cat"), (std::vector<int32_t>{22, 38, 54, 45}));
  EXPECT_EQ(tok->encode("<|im_start|>the"), (std::vector<int32_t>{1, 22, 38}));
  // Digits one by one, before the GPT-2 regex: ids from tokenizers 0.23.3 on the same tokenizer.json.
  EXPECT_EQ(tok->encode("a12 the 0,1."), (std::vector<int32_t>{3, 35, 36, 39, 29, 34, 33, 35, 32}));
  EXPECT_EQ(tok->decode({22, 38, 54, 45}), "the cat");
}

TEST(GgufTokenizer, TokenizerLoadsAGgufDirectly) {
  auto tok = Tokenizer::load(kDir + "tiny_llama.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->encode("a12 the 0,1."), (std::vector<int32_t>{3, 35, 36, 39, 29, 34, 33, 35, 32}));
  EXPECT_EQ(tok->vocab_size(), 66);
  auto none = Tokenizer::load(kDir + "tiny_qwen2.gguf");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("tokenizer.ggml.model"), std::string::npos) << none.status();
}

TEST(GgufTokenizer, UnsupportedKindsAreNamed) {
  auto f = GgufFile::open(kDir + "tiny_qwen2.gguf");  // no tokenizer metadata at all
  ASSERT_TRUE(f.ok());
  auto t = gguf_hf_tokenizer(*f);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("tokenizer.ggml.model"), std::string::npos) << t.status();
}

// ---- SentencePiece ("llama") vocabularies against transformers ----

using nlohmann::json;

json reference(const std::string& name) {
  std::ifstream in(kDir + name + ".reference.json");
  EXPECT_TRUE(in.good()) << name;
  return json::parse(in);
}

class SpmGguf : public ::testing::TestWithParam<std::string> {};

TEST_P(SpmGguf, TokenizerJsonIsTheOneTransformersBuilds) {
  auto f = GgufFile::open(kDir + GetParam() + ".gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  auto t = gguf_hf_tokenizer(*f);
  ASSERT_TRUE(t.ok()) << t.status();
  const json ref = reference(GetParam());
  json want = ref["tokenizer_json"], got = t->tokenizer_json;
  for (const char* k : {"added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder"})
    EXPECT_EQ(got[k], want[k]) << k << ": " << got[k].dump() << "\n  transformers: " << want[k].dump();
  const json merges = got["model"]["merges"];
  ASSERT_EQ(merges.size(), want["model"]["merges_count"]);
  const json head = want["model"]["merges_head"], tail = want["model"]["merges_tail"];
  for (size_t i = 0; i < head.size(); ++i) EXPECT_EQ(merges[i], head[i]) << "merge " << i;
  for (size_t i = 0; i < tail.size(); ++i)
    EXPECT_EQ(merges[merges.size() - tail.size() + i], tail[i]) << "merge " << merges.size() - tail.size() + i;
  for (const char* k : {"merges", "vocab"}) got["model"].erase(k);
  for (const char* k : {"merges_count", "merges_head", "merges_tail"}) want["model"].erase(k);
  EXPECT_EQ(got["model"], want["model"]);
  // The vocabulary is the file's token list (Gemma's whitespace runs spelled with "▁").
  EXPECT_EQ(t->tokenizer_json["model"]["vocab"].size(), f->get_strings("tokenizer.ggml.tokens")->size());
  const json& c = t->tokenizer_config_json;
  for (const auto& [k, v] : ref["special_tokens"].items()) EXPECT_EQ(c[k], v) << k;
  EXPECT_EQ(c["add_bos_token"], ref["add_bos_token"]);
  EXPECT_EQ(c["add_eos_token"], ref["add_eos_token"]);
  EXPECT_EQ(c["chat_template"], *f->get_string("tokenizer.chat_template"));
}

TEST_P(SpmGguf, IdsAndDecodesEqualTransformers) {
  auto tok = Tokenizer::load(kDir + GetParam() + ".gguf");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const json ref = reference(GetParam());
  EXPECT_EQ(tok->vocab_size(), ref["vocab_size"]);
  ASSERT_GE(ref["cases"].size(), 40u);
  for (const json& c : ref["cases"]) {
    const std::string text = c["text"];
    const bool add = c["add_special_tokens"];
    SCOPED_TRACE(testing::Message() << "text=" << testing::PrintToString(text) << " add=" << add);
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto ids = tok->encode(text, add);
    EXPECT_EQ(ids, want);
    EXPECT_EQ(tok->decode(want, false), c["decode"].get<std::string>());
    EXPECT_EQ(tok->decode(want, true), c["decode_skip_special"].get<std::string>());
  }
}

TEST_P(SpmGguf, ChatTemplateRendersAsTransformers) {
  const std::string path = kDir + GetParam() + ".gguf";
  auto tmpl = detect_chat_template(path);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  auto tok = Tokenizer::load(path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const json ref = reference(GetParam());
  ASSERT_FALSE(ref["chats"].empty());
  for (const json& chat : ref["chats"]) {
    std::vector<ChatMessage> messages;
    for (const json& m : chat["messages"]) messages.push_back({m["role"], m["content"]});
    auto r = tmpl->render(messages, true);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->text, chat["text"].get<std::string>());
    EXPECT_EQ(tok->encode(r->text, false), chat["ids"].get<std::vector<int32_t>>());
  }
}

INSTANTIATE_TEST_SUITE_P(Gguf, SpmGguf, ::testing::Values("spm_llama", "spm_gemma", "spm_phi3"));

// A small "llama" vocabulary written with Loom's GGUF writer, with one thing changed per case.
struct SpmSpec {
  int scores = 8;  // how many scores (8 tokens); 0 writes no tokenizer.ggml.scores
  int64_t type_of_b = 1;
  bool nan_score = false;
  std::vector<std::string> merges = {};  // tokenizer.ggml.merges when not empty
  std::string pre = "";                  // tokenizer.ggml.pre when not empty
  bool no_space_prefix = false;          // tokenizer.ggml.add_space_prefix false
};

std::string write_spm(const test::TempDir& dir, const std::string& name, const SpmSpec& spec) {
  const std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab"};
  const std::vector<int32_t> types = {2, 3, 3, 1, 1, static_cast<int32_t>(spec.type_of_b), 1, 1};
  std::vector<float> scores;
  for (int i = 0; i < spec.scores; ++i) scores.push_back(-static_cast<float>(i));
  if (spec.nan_score) scores[4] = std::nanf("");
  GgufWriter w;
  w.add("general.architecture", gguf_string("llama"));
  w.add("tokenizer.ggml.model", gguf_string("llama"));
  w.add("tokenizer.ggml.tokens", gguf_strings(tokens));
  if (spec.scores > 0) w.add("tokenizer.ggml.scores", gguf_f32s(scores));
  w.add("tokenizer.ggml.token_type", gguf_i32s(types));
  w.add("tokenizer.ggml.bos_token_id", gguf_u32(1));
  if (!spec.merges.empty()) w.add("tokenizer.ggml.merges", gguf_strings(spec.merges));
  if (!spec.pre.empty()) w.add("tokenizer.ggml.pre", gguf_string(spec.pre));
  if (spec.no_space_prefix) w.add("tokenizer.ggml.add_space_prefix", gguf_bool(false));
  const std::string path = dir.file(name + ".gguf");
  EXPECT_TRUE(w.write(path).ok());
  return path;
}

absl::Status convert(const std::string& path) {
  auto f = GgufFile::open(path);
  if (!f.ok()) return f.status();
  return gguf_hf_tokenizer(*f).status();
}

TEST(GgufSpmTokenizer, SmallVocabularyEncodes) {
  test::TempDir dir("loom_ggspm");
  auto tok = Tokenizer::load(write_spm(dir, "ok", {}));
  ASSERT_TRUE(tok.ok()) << tok.status();
  // Merges from the scores: "▁a" (score -6) before "ab" (-7); "ab" then finds no "a" left
  // (transformers 5.24 gives these ids from the same metadata).
  EXPECT_EQ(tok->encode("ab", true), (std::vector<int32_t>{1, 6, 5}));
  EXPECT_EQ(tok->decode({1, 6, 5}, true), "ab");
  // Merges in the file win over the scores: "a b" first leaves "▁" alone (transformers: the same).
  auto with_merges = Tokenizer::load(write_spm(dir, "merges", {.merges = {"a b", "\xE2\x96\x81 a"}}));
  ASSERT_TRUE(with_merges.ok()) << with_merges.status();
  EXPECT_EQ(with_merges->encode("ab", true), (std::vector<int32_t>{1, 3, 7}));
  // transformers 5.24 ignores add_space_prefix (and tokenizer.ggml.pre "default"): the same ids.
  auto no_prefix = Tokenizer::load(write_spm(dir, "nospace", {.pre = "default", .no_space_prefix = true}));
  ASSERT_TRUE(no_prefix.ok()) << no_prefix.status();
  EXPECT_EQ(no_prefix->encode("ab", true), (std::vector<int32_t>{1, 6, 5}));
  EXPECT_EQ(no_prefix->encode(" ab", true), (std::vector<int32_t>{1, 6, 5}));
}

TEST(GgufSpmTokenizer, BadMetadataNamesTheKey) {
  test::TempDir dir("loom_ggspm");
  absl::Status s = convert(write_spm(dir, "count", {.scores = 7}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tokenizer.ggml.scores has 7 entries for 8 tokens"), std::string::npos) << s;
  s = convert(write_spm(dir, "missing", {.scores = 0}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tokenizer.ggml.scores is missing"), std::string::npos) << s;
  s = convert(write_spm(dir, "type", {.type_of_b = 9}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tokenizer.ggml.token_type[5] is 9"), std::string::npos) << s;
  s = convert(write_spm(dir, "nan", {.nan_score = true}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tokenizer.ggml.scores[4] is NaN"), std::string::npos) << s;
  s = convert(write_spm(dir, "pre", {.pre = "llama-bpe"}));  // transformers: a byte-level split regex
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("tokenizer.ggml.pre is 'llama-bpe'"), std::string::npos) << s;
  auto tok = Tokenizer::load(dir.file("type.gguf"));  // the same message through Tokenizer::load
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("type.gguf"), std::string::npos) << tok.status();
}

}  // namespace
}  // namespace loom
