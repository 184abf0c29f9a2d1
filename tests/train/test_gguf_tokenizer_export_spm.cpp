// SentencePiece-style tokenizers written as llama.cpp's "llama" vocabulary by add_gguf_tokenizer:
// - read back by Loom's GGUF tokenizer (text/gguf_tokenizer_spm.cpp, itself checked against
//   transformers) they encode corpus.txt, the fixtures' cases and the spm_*.reference.json texts to
//   the ids of the source tokenizer.json, and decode them back alike (Gemma, Llama 2 / Phi-3 layout,
//   Mistral layout);
// - a real SentencePiece model (tests/fixtures/tokenizers/spm_model, tools/reference/make_spm_model_fixture.py)
//   gives, value for value, the tokens, scores and types convert_hf_to_gguf.py computes from its
//   tokenizer.model, both from tokenizer.model and from tokenizer.json alone;
// - what llama.cpp's tokenizer cannot reproduce is refused, naming the file and the cause.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/gguf.h"
#include "engine/gguf_writer.h"
#include "nlohmann/json.hpp"
#include "tests/temp_dir.h"
#include "text/tokenizer.h"
#include "train/gguf_tokenizer_export.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kTok = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/tokenizers/";
const std::string kGguf = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/gguf/";

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

void write_json(const std::string& path, const json& j) { std::ofstream(path) << j.dump(); }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The corpus (whole, and line by line), the fixture's cases and every SentencePiece reference text.
std::vector<std::string> texts(const std::string& fixture) {
  const std::string corpus = read_text(kTok + "corpus.txt");
  std::vector<std::string> out = {corpus};
  std::istringstream lines(corpus);
  for (std::string line; std::getline(lines, line);) out.push_back(line);
  if (fs::exists(kTok + fixture + "/cases.json"))
    for (const json& c : read_json(kTok + fixture + "/cases.json")["cases"]) out.push_back(c["text"]);
  for (const char* ref : {"spm_llama", "spm_gemma", "spm_phi3"})
    for (const json& c : read_json(kGguf + ref + ".reference.json")["cases"]) out.push_back(c["text"]);
  return out;
}

// add_gguf_tokenizer(dir) written as a .gguf of architecture `arch` (no tensors).
absl::StatusOr<std::string> export_tokenizer(const std::string& dir, const std::string& arch, int64_t vocab_size,
                                             const std::string& out) {
  GgufWriter w;
  w.add("general.architecture", gguf_string(arch));
  if (absl::Status s = add_gguf_tokenizer(dir, vocab_size, arch, w); !s.ok()) return s;
  if (absl::Status s = w.write(out); !s.ok()) return s;
  return out;
}

// The tokenizer read back from the GGUF against the source tokenizer.json, text by text.
void expect_same_tokenizer(const std::string& source, const std::string& gguf, const std::vector<std::string>& cases) {
  auto want = Tokenizer::load(source);
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = Tokenizer::load(gguf);
  ASSERT_TRUE(got.ok()) << got.status();
  size_t tokens = 0;
  for (const std::string& text : cases)
    for (bool add : {false, true}) {
      const auto ids = want->encode(text, add);
      ASSERT_EQ(got->encode(text, add), ids) << "add_special_tokens " << add << ": " << text;
      EXPECT_EQ(got->decode(ids), want->decode(ids)) << text;
      EXPECT_EQ(got->decode(ids, true), want->decode(ids, true)) << text;
      tokens += ids.size();
    }
  EXPECT_GT(tokens, 2000u);  // the corpus alone is several hundred tokens
}

TEST(GgufTokenizerExportSpm, GemmaRoundTrip) {
  test::TempDir dir("loom_spm_export");
  fs::copy_file(kTok + "gemma/tokenizer.json", dir.file("tokenizer.json"));
  write_json(dir.file("tokenizer_config.json"),
             {{"bos_token", "<bos>"}, {"eos_token", "<eos>"}, {"unk_token", "<unk>"}, {"pad_token", "<pad>"}});
  auto gguf = export_tokenizer(dir.path(), "gemma3", 1760, dir.file("t.gguf"));
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto f = GgufFile::open(*gguf);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(*f->get_string("tokenizer.ggml.pre"), "default");
  EXPECT_FALSE(f->has("tokenizer.ggml.merges"));
  EXPECT_EQ(*f->get_bool("tokenizer.ggml.add_space_prefix"), false);  // Gemma: no prefix space
  EXPECT_EQ(*f->get_bool("tokenizer.ggml.add_bos_token"), true);      // the post-processor adds <bos>
  EXPECT_EQ(*f->get_int("tokenizer.ggml.bos_token_id"), 2);
  EXPECT_EQ(*f->get_int("tokenizer.ggml.padding_token_id"), 0);
  const auto tokens = *f->get_strings("tokenizer.ggml.tokens");
  const auto types = *f->get_ints("tokenizer.ggml.token_type");
  ASSERT_EQ(tokens.size(), 1760u);
  EXPECT_EQ(tokens[4], "<start_of_turn>");
  EXPECT_EQ(types[4], 3);        // a special added token: CONTROL
  EXPECT_EQ(types[6], 6);        // <0x00>: BYTE
  EXPECT_EQ(tokens[1757], "[PAD1757]");
  EXPECT_EQ(types[1757], 5);     // ids the tokenizer lacks: UNUSED
  expect_same_tokenizer(kTok + "gemma/tokenizer.json", *gguf, texts("gemma"));
}

// The llama2 fixture has Llama 2's and Phi-3's layout (Prepend + Replace normalizer), which Loom
// reads back for phi3 files as transformers does.
TEST(GgufTokenizerExportSpm, Llama2LayoutRoundTripAsPhi3) {
  test::TempDir dir("loom_spm_export");
  fs::copy_file(kTok + "llama2/tokenizer.json", dir.file("tokenizer.json"));
  write_json(dir.file("tokenizer_config.json"), {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}});
  auto gguf = export_tokenizer(dir.path(), "phi3", 1571, dir.file("t.gguf"));
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto f = GgufFile::open(*gguf);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->has("tokenizer.ggml.add_space_prefix"));  // llama.cpp's default: a prefix space
  expect_same_tokenizer(kTok + "llama2/tokenizer.json", *gguf, texts("llama2"));
}

// Mistral's layout (a Metaspace pre-tokenizer that prepends to the first piece only), which Loom
// reads back for llama files as transformers does.
TEST(GgufTokenizerExportSpm, MistralLayoutRoundTripAsLlama) {
  test::TempDir dir("loom_spm_export");
  json tj = read_json(kTok + "llama2/tokenizer.json");
  tj["normalizer"] = nullptr;
  tj["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", false}};
  write_json(dir.file("tokenizer.json"), tj);
  write_json(dir.file("tokenizer_config.json"), {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}});
  auto gguf = export_tokenizer(dir.path(), "llama", 1571, dir.file("t.gguf"));
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  expect_same_tokenizer(dir.file("tokenizer.json"), *gguf, texts("llama2"));
}

// tokens / scores / types of a .gguf against reference.json's {tokens, scores, types}.
void expect_vocab(const std::string& gguf, const json& want) {
  auto f = GgufFile::open(gguf);
  ASSERT_TRUE(f.ok()) << f.status();
  const auto tokens = *f->get_strings("tokenizer.ggml.tokens");
  const auto scores = *f->get_floats("tokenizer.ggml.scores");
  const auto types = *f->get_ints("tokenizer.ggml.token_type");
  ASSERT_EQ(tokens.size(), want["tokens"].size());
  ASSERT_EQ(scores.size(), want["scores"].size());
  ASSERT_EQ(types.size(), want["types"].size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    EXPECT_EQ(tokens[id], want["tokens"][id].get<std::string>()) << id;
    EXPECT_EQ(static_cast<float>(scores[id]), want["scores"][id].get<float>()) << id << " " << tokens[id];
    EXPECT_EQ(types[id], want["types"][id].get<int64_t>()) << id << " " << tokens[id];
  }
}

// The spm_model folder in `dir`, without tokenizer.model when `with_model` is false.
void copy_spm_model(const test::TempDir& dir, bool with_model) {
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "tokenizer.model"})
    if (with_model || std::string(f) != "tokenizer.model") fs::copy_file(kTok + "spm_model/" + f, dir.file(f));
}

TEST(GgufTokenizerExportSpm, RealSentencePieceModelAsLlamaCppWritesIt) {
  const json ref = read_json(kTok + "spm_model/reference.json");
  const int64_t vocab_size = ref["vocab_size"];
  for (bool with_model : {true, false})
    for (const char* arch : {"llama", "phi3"}) {
      SCOPED_TRACE(std::string(arch) + (with_model ? " from tokenizer.model" : " from tokenizer.json alone"));
      test::TempDir dir("loom_spm_export");
      copy_spm_model(dir, with_model);
      auto gguf = export_tokenizer(dir.path(), arch, vocab_size, dir.file("t.gguf"));
      ASSERT_TRUE(gguf.ok()) << gguf.status();
      expect_vocab(*gguf, ref["llama_cpp"][arch]);
      auto f = GgufFile::open(*gguf);
      ASSERT_TRUE(f.ok());
      EXPECT_EQ(*f->get_string("tokenizer.chat_template"), read_text(kTok + "spm_model/chat_template.jinja"));
      EXPECT_EQ(*f->get_int("tokenizer.ggml.bos_token_id"), 1);
      EXPECT_EQ(*f->get_int("tokenizer.ggml.eos_token_id"), 2);
      EXPECT_EQ(*f->get_int("tokenizer.ggml.unknown_token_id"), 0);
      EXPECT_EQ(*f->get_bool("tokenizer.ggml.add_bos_token"), true);
    }
}

// The spm_model tokenizer.json has transformers 5's legacy layout (Metaspace prepending to every
// piece between added tokens); Loom reads llama files back with transformers' non-legacy one.
TEST(GgufTokenizerExportSpm, RealSentencePieceModelRoundTrip) {
  for (bool with_model : {true, false}) {
    SCOPED_TRACE(with_model ? "from tokenizer.model" : "from tokenizer.json alone");
    test::TempDir dir("loom_spm_export");
    copy_spm_model(dir, with_model);
    json tj = read_json(dir.file("tokenizer.json"));
    tj["pre_tokenizer"]["prepend_scheme"] = "first";
    write_json(dir.file("tokenizer.json"), tj);
    auto gguf = export_tokenizer(dir.path(), "llama", 704, dir.file("t.gguf"));
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    expect_same_tokenizer(dir.file("tokenizer.json"), *gguf, texts("spm_model"));
  }
}

// The export of `tj` (written over the gemma fixture's files) fails naming `want`.
void expect_refused(const json& tj, const std::string& want, const std::string& arch = "gemma3") {
  test::TempDir dir("loom_spm_export");
  write_json(dir.file("tokenizer.json"), tj);
  GgufWriter w;
  absl::Status s = add_gguf_tokenizer(dir.path(), 1760, arch, w);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(want), std::string::npos) << s;
  EXPECT_NE(s.message().find("tokenizer.json"), std::string::npos) << s;
}

TEST(GgufTokenizerExportSpm, RefusesWhatLlamaCppCannotReproduce) {
  const json gemma = read_json(kTok + "gemma/tokenizer.json");
  json t = gemma;
  t["model"] = {{"type", "Unigram"}, {"unk_id", 3}, {"vocab", json::array({json::array({"<unk>", 0.0})})}, {"byte_fallback", true}};
  expect_refused(t, "model.type is Unigram");
  t = gemma;
  t["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFKC"}}, gemma["normalizer"]})}};
  expect_refused(t, "normalizer step {\"type\":\"NFKC\"}");
  t = gemma;
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}, {"split", true}};
  expect_refused(t, "splits the text into words");
  // A merge repeated after others: one score cannot rank both places.
  t = gemma;
  t["model"]["merges"].push_back(t["model"]["merges"][0]);
  expect_refused(t, "again after other merges (first at model.merges[0])");
  // A token whose only merge is gone: llama.cpp would still make it from its halves.
  t = gemma;
  t["model"]["merges"].erase(5);
  expect_refused(t, "' but no merge makes it");
  t = gemma;
  t["model"]["merges"][3] = json::array({"\xE2\x96\x81", "not-a-token"});
  expect_refused(t, "model.merges[3]");
}

TEST(GgufTokenizerExportSpm, RefusesDisagreeingFiles) {
  test::TempDir dir("loom_spm_export");
  copy_spm_model(dir, true);
  json tj = read_json(dir.file("tokenizer.json"));
  // Rename the token of id 300 in tokenizer.json only.
  std::string name;
  for (const auto& [text, id] : tj["model"]["vocab"].items())
    if (id == 300) name = text;
  ASSERT_FALSE(name.empty());
  tj["model"]["vocab"].erase(name);
  tj["model"]["vocab"]["zzz-renamed"] = 300;
  write_json(dir.file("tokenizer.json"), tj);
  GgufWriter w;
  absl::Status s = add_gguf_tokenizer(dir.path(), 704, "llama", w);
  EXPECT_NE(s.message().find("id 300 is 'zzz-renamed' but " + dir.file("tokenizer.model") + " gives '" + name + "'"),
            std::string::npos) << s;
  // A truncated tokenizer.model: the reader's message, naming the file.
  const std::string bytes = read_text(kTok + "spm_model/tokenizer.model");
  std::ofstream(dir.file("tokenizer.model"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  GgufWriter w2;
  s = add_gguf_tokenizer(dir.path(), 704, "llama", w2);
  EXPECT_NE(s.message().find(dir.file("tokenizer.model")), std::string::npos) << s;
  EXPECT_NE(s.message().find("runs past the end"), std::string::npos) << s;
  // More pieces than the model has rows.
  fs::copy_file(kTok + "spm_model/tokenizer.model", dir.file("tokenizer.model"), fs::copy_options::overwrite_existing);
  fs::copy_file(kTok + "spm_model/tokenizer.json", dir.file("tokenizer.json"), fs::copy_options::overwrite_existing);
  GgufWriter w3;
  s = add_gguf_tokenizer(dir.path(), 600, "llama", w3);
  EXPECT_NE(s.message().find("700 pieces for a model vocabulary of 600"), std::string::npos) << s;
}

}  // namespace
}  // namespace loom
