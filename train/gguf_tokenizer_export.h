// The tokenizer.ggml.* and tokenizer.chat_template metadata of a GGUF export: copied from the source
// .gguf, or built from a Hugging Face folder's tokenizer.json (+ tokenizer.model) + tokenizer_config.json
// the way llama.cpp's convert_hf_to_gguf.py does for byte-level BPE ("gpt2") and SentencePiece-style
// ("llama": Llama 2, Mistral, Gemma, Phi-3) vocabularies.
#pragma once
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/gguf_writer.h"

namespace loom {

// model_path: a .gguf file (its tokenizer.* keys are copied as they are) or a Hugging Face folder.
// vocab_size: the model's embedding rows; ids the tokenizer lacks below it become "[PAD<id>]"
// tokens of type UNUSED (5), a tokenizer id at or above it is an error. arch: general.architecture
// of the file ("phi3" takes Phi3MiniModel's added-token rules). A tokenizer.json whose model is BPE
// with byte_fallback (or a folder with tokenizer.model alone) is written as a SentencePiece
// vocabulary, from tokenizer.model when there is one. Errors name the file and field: neither
// tokenizer.json nor tokenizer.model, a model or normalizer llama.cpp's tokenizers cannot reproduce
// (Unimplemented: Unigram, WordPiece, Unicode normalization, a byte-level pre-tokenizer llama.cpp has
// no name for, ...), tokenizer.model and tokenizer.json that disagree, a special token that is not
// in the vocabulary.
absl::Status add_gguf_tokenizer(const std::string& model_path, int64_t vocab_size, const std::string& arch, GgufWriter& w);

}  // namespace loom
