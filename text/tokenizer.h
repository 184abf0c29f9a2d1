// Tokenizer: Hugging Face tokenizer.json in C++ — byte-level BPE (Llama 3, Qwen2/3: regex
// pre-tokenizer, byte-to-unicode map, merges) and SentencePiece-style BPE with byte fallback
// (Llama 2, Gemma: metaspace "▁", <0xNN> tokens), with added and special tokens. Encoding matches
// the `tokenizers` library token for token.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace loom {

class Tokenizer {
 public:
  enum class Kind { kByteLevelBpe, kSentencePieceBpe };

  // Parses tokenizer.json (a file path, or a folder holding tokenizer.json), or the tokenizer of a
  // .gguf file (text/gguf_tokenizer.h). Unsupported models
  // (WordPiece, Unigram, ...), normalizers or pre-tokenizers are errors naming them.
  static absl::StatusOr<Tokenizer> load(const std::string& path);

  // As tokenizers' `encode(text, add_special_tokens=...)`: added/special tokens written in the text
  // are matched as single tokens; with add_special_tokens the post-processor's tokens (e.g. BOS)
  // are added.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Same, with each token's [begin, end) byte range in `text` (empty for inserted specials).
  std::vector<int32_t> encode_with_offsets(std::string_view text, bool add_special_tokens,
                                           std::vector<std::pair<size_t, size_t>>* offsets) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;
  int64_t vocab_size() const;  // highest id + 1, added tokens included
  // OK when every id this tokenizer can produce has a row in a model of `model_vocab_size`;
  // otherwise the error that `loom train` and `loom generate` give.
  absl::Status fits_vocab(int64_t model_vocab_size) const;
  Kind kind() const;
  std::optional<int32_t> bos_id() const;  // from the post-processor / added tokens
  std::optional<int32_t> eos_id() const;
  bool is_special(int32_t id) const;

  Tokenizer();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom
