// The SentencePiece half of the GGUF tokenizer export (train/gguf_tokenizer_export_spm.cpp), used by
// train/gguf_tokenizer_export.cpp and its tests.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace loom::gguf_export {

// A tokenizer.json llama.cpp holds as a SentencePiece ("llama") vocabulary rather than byte-level
// BPE: a BPE model with byte_fallback, or a Unigram model (which sentencepiece_vocab refuses).
bool is_sentencepiece_style(const nlohmann::json& tokenizer_json);

// tokenizer.ggml.tokens / scores / token_type of a SentencePiece vocabulary, `vocab_size` of each.
struct SpmVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  std::vector<bool> filled;  // false for the "[PAD<id>]" tokens of ids the tokenizer lacks
  bool space_prefix = true;  // tokenizer.ggml.add_space_prefix (written when false)
};

// The vocabulary convert_hf_to_gguf.py writes for `arch` ("llama", "gemma3", "phi3", ...) from folder
// `dir`: from tokenizer.model when the folder has one (its pieces, scores and types, then the
// added-token overrides of the converter's _create_vocab_sentencepiece, or Phi3MiniModel.set_vocab's
// for phi3), else from `tokenizer_json` (not null then) as the same model would give: scores that
// order the pieces as tokenizer.json's merges do. Errors name the file and what llama.cpp's
// SentencePiece tokenizer cannot reproduce.
absl::StatusOr<SpmVocab> sentencepiece_vocab(const std::filesystem::path& dir, const nlohmann::json* tokenizer_json,
                                             const nlohmann::json& tokenizer_config, const std::string& arch,
                                             int64_t vocab_size);

}  // namespace loom::gguf_export
