// The tokenizer.ggml.* and tokenizer.chat_template metadata of a GGUF export: copied from the source
// .gguf, or built from a Hugging Face folder's tokenizer.json + tokenizer_config.json the way
// llama.cpp's convert_hf_to_gguf.py does for byte-level BPE vocabularies.
#pragma once
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/gguf_writer.h"

namespace loom {

// model_path: a .gguf file (its tokenizer.* keys are copied as they are) or a Hugging Face folder.
// vocab_size: the model's embedding rows; ids the tokenizer lacks below it become "[PAD<id>]"
// tokens of type UNUSED (5), a tokenizer id at or above it is an error. Errors name the file and
// field: no tokenizer.json, a model other than byte-level BPE (Unimplemented), a pre-tokenizer
// llama.cpp has no name for, a special token that is not in the vocabulary.
absl::Status add_gguf_tokenizer(const std::string& model_path, int64_t vocab_size, GgufWriter& w);

}  // namespace loom
