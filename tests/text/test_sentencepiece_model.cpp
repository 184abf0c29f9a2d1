// tokenizer.model read by hand: the pieces of a model the sentencepiece library trained equal what
// its own protobuf code reads (tests/fixtures/tokenizers/spm_model/reference.json, made by
// tools/reference/make_spm_model_fixture.py), and bytes that are not a ModelProto are errors naming the place.
#include "text/sentencepiece_model.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"

namespace loom {
namespace {

const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/tokenizers/spm_model/";

std::string model_bytes() {
  std::ifstream in(kDir + "tokenizer.model", std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(SentencePieceModel, PiecesAsTheSentencePieceLibraryReadsThem) {
  std::ifstream in(kDir + "reference.json");
  const auto ref = nlohmann::json::parse(in);
  auto m = load_sentencepiece_model(kDir + "tokenizer.model");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->pieces.size(), ref["pieces"].size());
  for (size_t i = 0; i < m->pieces.size(); ++i) {
    EXPECT_EQ(m->pieces[i].piece, ref["pieces"][i][0].get<std::string>()) << i;
    EXPECT_EQ(m->pieces[i].score, ref["pieces"][i][1].get<float>()) << i;
    EXPECT_EQ(m->pieces[i].type, ref["pieces"][i][2].get<int>()) << i;
  }
  EXPECT_EQ(m->model_type, ref["model_type"].get<int>());
  EXPECT_EQ(m->model_type, SentencePieceModel::kBpe);
  // The trainer's settings (tools/reference/make_spm_model_fixture.py): byte fallback, identity normalization,
  // a dummy prefix, whitespace kept.
  EXPECT_TRUE(m->byte_fallback);
  EXPECT_EQ(m->normalizer_name, "identity");
  EXPECT_FALSE(m->has_precompiled_charsmap);
  EXPECT_TRUE(m->add_dummy_prefix);
  EXPECT_FALSE(m->remove_extra_whitespaces);
  EXPECT_TRUE(m->escape_whitespaces);
}

TEST(SentencePieceModel, UnknownFieldsAreSkipped) {
  // Field 99 as a varint, field 98 as fixed64, field 97 as bytes, field 96 as fixed32: all skipped.
  const std::string extra = std::string("\x98\x06\x05", 3) + std::string("\x91\x06", 2) + std::string(8, '\x01') +
                            std::string("\x8a\x06\x02xy", 5) + std::string("\x85\x06", 2) + std::string(4, '\x02');
  auto a = parse_sentencepiece_model(model_bytes(), "a");
  auto b = parse_sentencepiece_model(extra + model_bytes() + extra, "b");
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  ASSERT_EQ(a->pieces.size(), b->pieces.size());
  EXPECT_EQ(a->pieces.back().piece, b->pieces.back().piece);
}

TEST(SentencePieceModel, Errors) {
  const std::string bytes = model_bytes();
  auto m = parse_sentencepiece_model(bytes.substr(0, bytes.size() - 3), "t.model");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("t.model"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("runs past the end"), std::string::npos) << m.status();
  // A piece of type 9: pieces (field 1, bytes) holding type (field 3, varint) 9.
  m = parse_sentencepiece_model(std::string("\x0a\x05\x0a\x01x\x18\x09", 7), "t.model");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("t.model pieces[0]: type 9 is none of 1 (normal) to 6 (byte)"), std::string::npos)
      << m.status();
  // pieces as a varint instead of a message.
  m = parse_sentencepiece_model(std::string("\x08\x01", 2), "t.model");
  EXPECT_NE(m.status().message().find("pieces has wire type 0, expected 2"), std::string::npos) << m.status();
  // An endless varint.
  m = parse_sentencepiece_model(std::string(12, '\xff'), "t.model");
  EXPECT_NE(m.status().message().find("longer than 10 bytes"), std::string::npos) << m.status();
  // A group (wire type 3) and nothing at all.
  m = parse_sentencepiece_model(std::string("\x0b", 1), "t.model");
  EXPECT_NE(m.status().message().find("wire type 3"), std::string::npos) << m.status();
  m = parse_sentencepiece_model("", "t.model");
  EXPECT_NE(m.status().message().find("no pieces"), std::string::npos) << m.status();
  m = load_sentencepiece_model(kDir + "missing.model");
  EXPECT_TRUE(absl::IsNotFound(m.status())) << m.status();
}

}  // namespace
}  // namespace loom
