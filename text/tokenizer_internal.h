// Internals of the tokenizer shared by text/tokenizer*.cpp: UTF-8 helpers, Unicode classes, the
// hand-written matcher for the Llama 3 / Qwen2 / GPT-2 split regexes, and the BPE model.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace loom::tok {

// ---- UTF-8 and Unicode classes ----

struct UnicodeRange {
  uint32_t first, last;
  uint8_t klass;  // kLetter | kNumber | kSpace
};
extern const UnicodeRange kUnicodeRanges[];
extern const size_t kNumUnicodeRanges;
constexpr uint8_t kLetter = 1, kNumber = 2, kSpace = 4;

uint8_t unicode_class(uint32_t cp);

// Key for heterogeneous lookups in absl maps (absl::string_view may not be std::string_view).
inline absl::string_view key(std::string_view s) { return absl::string_view(s.data(), s.size()); }  // 0 when none of letter / number / space

// Decodes the code point at s[i]; sets *len to its byte length. Malformed bytes decode as U+FFFD
// with length 1.
uint32_t decode_utf8(std::string_view s, size_t i, size_t* len);
void append_utf8(std::string* out, uint32_t cp);
// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// ---- Pre-tokenizer regexes ----

enum class SplitPattern { kLlama3, kQwen2, kGpt2 };
// Recognises the regex text of a Split pre-tokenizer; false when it is not one we implement.
bool parse_split_pattern(std::string_view regex, SplitPattern* out);
// Appends [begin, end) of each regex match in text, in order (every byte is in some match, as
// these patterns match any character).
void split_pattern(std::string_view text, SplitPattern pattern, std::vector<std::pair<uint32_t, uint32_t>>* out);

// A token id as tokenizer.json writes it, read as 64 bits (int32 would wrap 2^32 + 7 to 7);
// nullopt when it is not an integer in [0, 2^31).
inline std::optional<int32_t> json_token_id(const nlohmann::json& v) {
  if (!v.is_number_integer()) return std::nullopt;
  const int64_t id = v.get<int64_t>();
  if (id < 0 || id > INT32_MAX) return std::nullopt;
  return static_cast<int32_t>(id);
}

// ---- BPE model ----

class Bpe {
 public:
  // `model` is tokenizer.json's "model" object (type BPE). `byte_level` says pieces are raw bytes
  // mapped through GPT-2's byte-to-unicode table (ByteLevel pre-tokenizer) rather than text.
  absl::Status load(const nlohmann::json& model, const std::string& path, bool byte_level);

  // Encodes one pre-tokenized piece (raw bytes for byte-level, normalized text otherwise); appends
  // the ids and, when spans is non-null, each token's [begin, end) byte range within the piece.
  void encode_piece(std::string_view piece, std::vector<int32_t>* ids,
                    std::vector<std::pair<uint32_t, uint32_t>>* spans) const;

  const std::vector<std::string>& id_to_token() const { return id_to_token_; }
  const absl::flat_hash_map<std::string, int32_t>& vocab() const { return vocab_; }
  std::optional<int32_t> unk_id() const { return unk_id_; }

 private:
  struct Symbol {
    int32_t id;
    uint32_t begin, end;  // bytes of the piece
  };
  void initial_symbols(std::string_view piece, std::vector<Symbol>* syms) const;
  void merge(std::vector<Symbol>* syms) const;
  void lookup_whole(std::string_view piece, int32_t* id) const;

  bool byte_level_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::optional<int32_t> unk_id_;
  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  // Byte-level: the raw bytes each token stands for, and the id of each single byte (-1 if absent).
  absl::flat_hash_map<std::string, int32_t> raw_vocab_;
  int32_t byte_id_[256];
  // Text BPE: the <0xNN> byte-fallback ids (-1 if absent).
  int32_t fallback_id_[256];
  // (left id << 32 | right id) -> (rank, merged id).
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  // Results for repeated pieces; filled lazily, guarded for concurrent encodes.
  mutable absl::flat_hash_map<std::string, std::vector<Symbol>> cache_;
  mutable absl::Mutex cache_mu_;
};

// GPT-2's byte-to-unicode table: the code point byte b is written as in byte-level vocabularies.
uint32_t byte_to_unicode(uint8_t b);
// Inverse of byte_to_unicode; -1 when cp is not one of the 256.
int unicode_to_byte(uint32_t cp);

}  // namespace loom::tok
