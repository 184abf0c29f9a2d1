// The tokenizer of a llama.cpp GGUF file (tokenizer.ggml.* metadata) written back as the
// tokenizer.json + tokenizer_config.json a Hugging Face model folder ships, with the same ids.
#pragma once
#include "absl/status/statusor.h"
#include "engine/gguf.h"
#include "nlohmann/json.hpp"

namespace loom {

struct HfTokenizerFiles {
  nlohmann::json tokenizer_json;
  nlohmann::json tokenizer_config_json;  // special tokens, add_bos/eos, chat_template
};

// tokenizer.ggml.model "gpt2" (byte-level BPE) with tokenizer.ggml.pre smollm / starcoder / refact,
// gpt-2 / default, llama-bpe / llama3, qwen2; and "llama" (SentencePiece-style BPE with scores, as
// Llama 2, Mistral, Gemma and Phi-3 files carry) as transformers builds it from the same file:
// byte-fallback BPE whose merges come from the scores, Metaspace (Gemma: spaces -> "▁", Phi-3: a
// Prepend normalizer). Unimplemented for other models ("bert", "t5", ...) and pre-tokenizers,
// naming them; InvalidArgument for inconsistent metadata (token types, scores or merges that
// disagree with the token list, missing scores, ids out of range), naming the key.
absl::StatusOr<HfTokenizerFiles> gguf_hf_tokenizer(const GgufFile& file);

// The tokenizer.ggml.pre whose pre-tokenizer (and normalizer) gguf_hf_tokenizer writes equals this
// tokenizer.json's: "smollm", "gpt-2", "llama-bpe" or "qwen2"; "" when none does.
std::string gguf_pre_tokenizer_name(const nlohmann::json& tokenizer_json);

}  // namespace loom
