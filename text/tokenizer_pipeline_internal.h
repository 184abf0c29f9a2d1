// Internal to text/tokenizer.cpp and text/tokenizer_load.cpp: the tokenizer.json pipeline as
// loaded (added tokens, normalizer and decoder steps, the BPE model) in Tokenizer::Impl.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer.h"
#include "text/tokenizer_internal.h"

namespace loom {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

// Normalizer steps. NFC (text/unicode_nfc.h) is skipped when the quick check says the text is NFC.
// kMetaspace is the Metaspace pre-tokenizer's rewriting of its piece: " " -> a, then a prepended
// unless the piece starts with it (prepend: 0 never, 1 always, 2 only the piece at offset 0).
enum class NormKind { kPrepend, kReplace, kNfc, kMetaspace };
struct NormStep {
  NormKind kind;
  std::string a, b;  // prepend text; or pattern -> content; Metaspace: the replacement
  int prepend = 0;
};

enum class DecKind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip };
struct DecStep {
  DecKind kind;
  std::string a, b;  // Replace: pattern -> content; Strip: content
  int start = 0, stop = 0;
};

// A normalized string with, for each of its bytes, the original byte range of the character it
// came from.
struct Normalized {
  std::string s;
  std::vector<uint32_t> begin, end;
};

inline constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 "▁"

struct Tokenizer::Impl {
  std::string path;
  Kind kind = Kind::kByteLevelBpe;
  tok::Bpe bpe;
  std::vector<AddedToken> added;
  absl::flat_hash_map<std::string, int32_t> added_by_content;
  absl::flat_hash_map<int32_t, size_t> added_by_id;
  std::vector<size_t> by_first_byte[256];  // added-token indices, longest first
  std::vector<NormStep> norm;
  std::optional<tok::SplitPattern> split;
  bool byte_level = false;
  int digits = 0;  // a Digits pre-tokenizer step: 0 none, 1 individual digits, 2 runs of digits
  // SentencePiece-style BPE whose vocab has "▁" only at the start of tokens: no token can span a
  // boundary between a non-"▁" character and a "▁", so the text is cut there into words that BPE
  // (and its cache) handles one at a time, with the same result as merging the whole text.
  bool metaspace_words = false;
  // A Metaspace pre-tokenizer with split=true: each piece starts at a replacement character.
  std::string metaspace_split;
  bool has_decoder = false;
  std::vector<DecStep> dec;
  bool has_template = false;
  std::vector<std::optional<std::vector<int32_t>>> single;  // nullopt = the sequence
  std::optional<int32_t> bos, eos;
  int64_t vocab_size = 0;

  absl::Status parse_added(const nlohmann::json& j);
  absl::Status parse_normalizer(const nlohmann::json& j, const std::string& where);
  absl::Status parse_pre_tokenizer(const nlohmann::json& j);
  absl::Status parse_decoder(const nlohmann::json& j, const std::string& where);
  absl::Status parse_post_processor(const nlohmann::json& j, const std::string& where);

  struct Segment {
    size_t begin, end;
    int32_t added_id;  // -1: text
  };
  void split_added(std::string_view text, std::vector<Segment>* out) const;
  void encode_text(std::string_view text, size_t begin, size_t end, std::vector<int32_t>* ids,
                   std::vector<std::pair<size_t, size_t>>* offsets) const;
  Normalized normalize(std::string_view text, size_t begin, size_t end, bool track) const;
  std::string decode(const std::vector<std::string>& tokens) const;
};

}  // namespace loom
