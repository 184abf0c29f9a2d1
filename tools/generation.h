// What `loom generate` and `loom chat` share: the model, tokenizer and adapter loaded for sampling,
// the sampling flags, the chat template with its end-of-turn tokens, and the text streamed to the
// terminal as tokens come.
#pragma once
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/causal_lm.h"
#include "models/generate.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "tools/cli_args.h"

namespace loom::cli {

// --model, --adapter, --device, --dtype, --max-new-tokens, --temperature, --top-p, --seed.
std::vector<FlagSpec> generation_flags();

struct GenerationModel {
  std::string path;
  std::unique_ptr<CausalLM> model;
  std::unique_ptr<Tokenizer> tokenizer;
  Device device;
  DType dtype;
  GenerateOptions options;  // from the flags; stop_ids: the model's eos tokens
};
// Loads --model (a Hugging Face folder or .gguf file) with --adapter on --device in --dtype and
// reads the sampling flags; errors name the flag or file.
absl::StatusOr<GenerationModel> load_generation_model(const Args& args);

// The model's chat template (a folder's, or a .gguf file's tokenizer.chat_template); its end-of-turn
// markers that are tokens of the vocabulary are added to m.options.stop_ids.
absl::StatusOr<ChatTemplate> load_chat_template(GenerationModel& m);

// The prompt ids of a conversation rendered with the template and a generation prompt (the template
// writes any BOS itself, as apply_chat_template, which tokenizes without special tokens).
absl::StatusOr<std::vector<int32_t>> chat_prompt(const GenerationModel& m, const ChatTemplate& t,
                                                 const std::vector<ChatMessage>& messages);

struct GenerationResult {
  std::vector<int32_t> ids;
  std::string text;  // decoded without special tokens
  double seconds = 0, prefill_seconds = 0;
  double tokens_per_second() const;  // decode rate: tokens after the first over the time after it
};
// Generates from `prompt` and writes the decoded text to `out` as it comes (only whole UTF-8
// characters, never special tokens), without a final newline.
GenerationResult generate_streamed(const GenerationModel& m, const std::vector<int32_t>& prompt,
                                   const GenerateOptions& options, std::FILE* out);

}  // namespace loom::cli
