// Pieces shared by the GGUF tokenizer converters (text/gguf_tokenizer*.cpp): metadata checks that
// name the key, and the tokenizer.json parts both the byte-level and the SentencePiece path write.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf.h"
#include "nlohmann/json.hpp"
#include "text/gguf_tokenizer.h"

namespace loom::gguf_tok {

// llama.cpp's token types (tokenizer.ggml.token_type); 0 is "undefined".
constexpr int64_t kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4, kTypeUnused = 5,
                  kTypeByte = 6;

// tokenizer.ggml.token_type (all normal when absent): one per token, each 0-6, else InvalidArgument
// naming the key, the index and the value.
absl::StatusOr<std::vector<int64_t>> token_types(const GgufFile& f, size_t n_tokens);

// token -> id; InvalidArgument naming tokenizer.ggml.tokens[id] for a token repeated.
absl::StatusOr<nlohmann::json> vocab_of(const GgufFile& f, const std::vector<std::string>& tokens);

// tokenizer.ggml.merges as (left, right), each "left right"; InvalidArgument naming the entry.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> merge_pairs(const GgufFile& f);

// tokenizer.json's added-token entry.
nlohmann::json added_token(const std::string& content, int64_t id, bool special, bool normalized);

// A TemplateProcessing that puts `bos` before and `eos` after each sequence (either may be empty:
// not added), as transformers' update_post_processor writes it.
nlohmann::json template_processing(const std::string& bos, int64_t bos_id, const std::string& eos, int64_t eos_id);

// Merges recovered from a vocabulary without any, as transformers' generate_merges recovers them:
// every split of a token into two tokens, best first by the token's score, then the longer left
// and right pieces (in characters); ties keep token order, and within a token (left id, right id).
std::vector<std::pair<std::string, std::string>> generate_merges(const std::vector<std::string>& tokens,
                                                                  const std::vector<double>& scores);

// tokenizer.ggml.model "llama" for general.architecture `arch`.
absl::StatusOr<HfTokenizerFiles> sentencepiece_tokenizer(const GgufFile& f, const std::string& arch);

}  // namespace loom::gguf_tok
