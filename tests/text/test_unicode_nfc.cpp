// NFC tests: loom::unicode::nfc against Python's unicodedata.normalize('NFC', s) (fixture made by
// tools/codegen/make_nfc_tables.py), the quick check, the tokenizers-style alignment, and the qwen2 tokenizer
// (normalizer NFC) against the Hugging Face `tokenizers` library on text that is not NFC.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer.h"
#include "text/unicode_nfc.h"

namespace loom {
namespace {

using json = nlohmann::json;
using unicode::NfcSpan;

std::string fixture(const std::string& name) { return std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/tokenizers/" + name; }

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

std::string hex(const std::string& s) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    std::snprintf(buf, sizeof buf, "%02X ", c);
    out += buf;
  }
  return out;
}

TEST(UnicodeNfc, MatchesPythonUnicodedata) {
  const json f = read_json(fixture("nfc_cases.json"));
  const json& cases = f["cases"];
  ASSERT_GT(cases.size(), 90u);
  EXPECT_EQ(f["unicode_version"].get<std::string>(), unicode::kNfcUnicodeVersion);  // tables and fixture agree
  int changed = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"], want = c["nfc"];
    SCOPED_TRACE(c["name"].get<std::string>());
    std::string got;
    std::vector<NfcSpan> spans;
    unicode::nfc(text, &got, &spans);
    ASSERT_EQ(got, want) << "in:   " << hex(text) << "\nwant: " << hex(want) << "\ngot:  " << hex(got);
    size_t bytes = 0, src = 0;
    for (const auto& sp : spans) bytes += sp.bytes, src += sp.src_bytes;
    EXPECT_EQ(bytes, got.size());
    EXPECT_EQ(src, text.size());
    EXPECT_EQ(unicode::nfc(got), got);  // idempotent
    if (unicode::is_nfc_quick(text)) {
      EXPECT_EQ(text, want);  // "Yes" must never be wrong
    }
    changed += text != want;
  }
  EXPECT_GT(changed, 60);  // most cases do change: the test sees real work
}

TEST(UnicodeNfc, QuickCheck) {
  EXPECT_TRUE(unicode::is_nfc_quick(""));
  EXPECT_TRUE(unicode::is_nfc_quick("plain ASCII text, long enough for the 8-byte path"));
  EXPECT_TRUE(unicode::is_nfc_quick("caf\u00e9 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4 \U0001F600"));
  EXPECT_TRUE(unicode::is_nfc_quick("a\u0316\u0350"));   // marks in canonical order that never compose
  EXPECT_FALSE(unicode::is_nfc_quick("a\u0350\u0316"));  // out of order (230 before 220)
  EXPECT_FALSE(unicode::is_nfc_quick("cafe\u0301"));     // Maybe: U+0301 may compose
  EXPECT_FALSE(unicode::is_nfc_quick("\u212b"));         // No: singleton
  EXPECT_FALSE(unicode::is_nfc_quick("\uac00\u11a8"));   // Maybe: Hangul T jamo
  EXPECT_FALSE(unicode::is_nfc_quick(std::string(1000, 'x') + "\u0958"));  // No: exclusion, after the fast path
  EXPECT_TRUE(unicode::is_nfc_quick("\xff\xc3 bad bytes"));  // malformed bytes pass through as starters
}

TEST(UnicodeNfc, CombiningClasses) {
  EXPECT_EQ(unicode::canonical_combining_class('A'), 0);
  EXPECT_EQ(unicode::canonical_combining_class(0x0301), 230);
  EXPECT_EQ(unicode::canonical_combining_class(0x0323), 220);
  EXPECT_EQ(unicode::canonical_combining_class(0x0345), 240);
  EXPECT_EQ(unicode::canonical_combining_class(0x05B0), 10);
  EXPECT_EQ(unicode::canonical_combining_class(0x093C), 7);
  EXPECT_EQ(unicode::canonical_combining_class(0x3099), 8);
  EXPECT_EQ(unicode::canonical_combining_class(0x4E00), 0);
  EXPECT_EQ(unicode::canonical_combining_class(0x10FFFF), 0);
  EXPECT_EQ(unicode::canonical_combining_class(0x200000), 0);
}

// The tables are binary-searched: they must be sorted and (for ranges) disjoint.
TEST(UnicodeNfc, TablesAreSorted) {
  for (size_t i = 0; i < unicode::kNumNfcProps; ++i) {
    EXPECT_LE(unicode::kNfcProps[i].first, unicode::kNfcProps[i].last);
    if (i > 0) {
      EXPECT_LT(unicode::kNfcProps[i - 1].last, unicode::kNfcProps[i].first);
    }
  }
  for (size_t i = 1; i < unicode::kNumNfcDecomps; ++i) EXPECT_LT(unicode::kNfcDecomps[i - 1].cp, unicode::kNfcDecomps[i].cp);
  for (size_t i = 1; i < unicode::kNumNfcPairs; ++i) {
    const auto& a = unicode::kNfcPairs[i - 1];
    const auto& b = unicode::kNfcPairs[i];
    EXPECT_TRUE(a.first < b.first || (a.first == b.first && a.second < b.second)) << i;
  }
}

TEST(UnicodeNfc, MalformedBytesPassThrough) {
  EXPECT_EQ(unicode::nfc("\xff" "e\xcc\x81 \xc3"), "\xff\xc3\xa9 \xc3");
  EXPECT_EQ(unicode::nfc("\xed\xa0\x80\xcc\x81"), "\xed\xa0\x80\xcc\x81");  // a surrogate is 3 raw bytes
  EXPECT_EQ(unicode::nfc("\xc0\xaf" "A\xcc\x8a"), "\xc0\xaf\xc3\x85");    // overlong
}

// Alignment as unicode-normalization-alignments reports it (checked with `tokenizers` offsets):
// the first code point of a decomposition replaces the input character, the others are inserted;
// a composite stands for everything it absorbed.
TEST(UnicodeNfc, SpansFollowTokenizers) {
  auto spans_of = [](const std::string& s) {
    std::string out;
    std::vector<NfcSpan> sp;
    unicode::nfc(s, &out, &sp);
    std::vector<std::pair<uint32_t, uint32_t>> v;
    for (const auto& x : sp) v.emplace_back(x.bytes, x.src_bytes);
    return v;
  };
  using V = std::vector<std::pair<uint32_t, uint32_t>>;
  EXPECT_EQ(spans_of("e\xcc\x81"), (V{{2, 3}}));                          // e + U+0301 -> é
  EXPECT_EQ(spans_of("\xcd\x84"), (V{{2, 2}, {2, 0}}));                    // U+0344 -> U+0308 U+0301
  EXPECT_EQ(spans_of("\xe1\xb8\x8b\xcc\xa3"), (V{{3, 5}, {2, 0}}));        // ḋ + U+0323 -> ḍ + U+0307
  EXPECT_EQ(spans_of("q\xcc\x87\xcc\xa3"), (V{{1, 1}, {2, 2}, {2, 2}}));   // reordered marks
  EXPECT_EQ(spans_of("\xe0\xa5\x98"), (V{{3, 3}, {3, 0}}));                // U+0958 excluded
  EXPECT_EQ(spans_of("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8"), (V{{3, 9}}));  // L V T -> 각
}

// The qwen2 fixture's normalizer is NFC: its encodings of non-NFC text (ids, offsets, decodes)
// must match the `tokenizers` library's (tests/fixtures/tokenizers/qwen2/nfc_cases.json).
TEST(UnicodeNfc, Qwen2TokenizerMatchesHuggingFace) {
  auto tok = Tokenizer::load(fixture("qwen2"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const json cases = read_json(fixture("qwen2/nfc_cases.json"))["cases"];
  ASSERT_GE(cases.size(), 20u);
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const bool add = c["add_special_tokens"];
    SCOPED_TRACE(testing::Message() << "text=" << hex(text) << " add=" << add);
    std::vector<std::pair<size_t, size_t>> offsets;
    const auto ids = tok->encode_with_offsets(text, add, &offsets);
    ASSERT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << "tokens: " << c["tokens"].dump();
    EXPECT_EQ(tok->encode(text, add), ids);
    std::vector<std::pair<size_t, size_t>> want;
    for (const auto& o : c["offsets"]) want.emplace_back(o[0].get<size_t>(), o[1].get<size_t>());
    EXPECT_EQ(offsets, want);
    EXPECT_EQ(tok->decode(ids, false), c["decode"].get<std::string>());
    EXPECT_EQ(tok->decode(ids, true), c["decode_skip_special"].get<std::string>());
  }
}

}  // namespace
}  // namespace loom
