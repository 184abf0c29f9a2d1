// GGUF tokenizer metadata -> tokenizer.json / tokenizer_config.json: ids equal the GGUF token list,
// control tokens become special added tokens, the chat template and special tokens carry over, and
// Loom's own Tokenizer encodes with the result as BPE over the file's merges does (ids worked out by
// hand from tools/make_gguf_fixtures.py's tiny vocabulary, and from the tokenizers library).
#include "text/gguf_tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/temp_dir.h"
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

}  // namespace
}  // namespace loom
