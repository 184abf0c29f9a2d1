// Preference pairs for `--objective dpo|ipo|simpo|orpo`, in TRL's dataset formats, one pair per JSONL
// line (train/data_formats.h's limits and "<file>:<line>:" errors):
//   {"prompt": "...", "chosen": "...", "rejected": "..."}     standard: EOS is appended to each
//       completion that does not end with it, as TRL 1.15's DPOTrainer does;
//   {"prompt": [messages], "chosen": [messages], "rejected": [messages]}   conversational: the prompt
//       rendered with the model's chat template and its generation prompt, each completion as the
//       rest of the rendering of prompt + completion (so it ends with the template's end of turn);
//   {"chosen": [...], "rejected": [...]} (or two strings): TRL's implicit prompt, the longest shared
//       start of the two (whole messages; for strings, up to the last space before they differ).
// As TRL tokenizes: prompt, prompt + chosen and prompt + rejected are tokenized whole and each
// completion starts where the prompt's tokens stop being a prefix of both. Truncation: --max-prompt-len
// keeps the prompt's end (older TRL's max_prompt_length), --max-len keeps each sequence's start (TRL's
// max_length, truncation_mode "keep_start") and a pair whose prompt alone fills it is dropped.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace loom {

struct PreferenceExample {
  std::vector<int32_t> prompt, chosen, rejected;  // the completions without the prompt
};

struct PreferenceDataOptions {
  bool skip_bad_lines = false;
  absl::StatusOr<ChatTemplate> chat_template = absl::NotFoundError("no chat template was chosen");
  int64_t max_len = 0;         // prompt + completion tokens (0 = no limit)
  int64_t max_prompt_len = 0;  // prompt tokens (0 = no limit)
  int64_t max_file_bytes = 0;
};

struct PreferenceStats {
  int64_t lines = 0, pairs = 0, skipped = 0, conversations = 0;
  int64_t truncated = 0;         // pairs with a prompt or a completion cut
  int64_t dropped_too_long = 0;  // pairs whose prompt alone reached --max-len
  int64_t prompt_tokens = 0, completion_tokens = 0;  // over both sides
};

absl::StatusOr<std::vector<PreferenceExample>> load_preference_jsonl(const std::string& path, const Tokenizer& tok,
                                                                     const PreferenceDataOptions& options,
                                                                     PreferenceStats* stats);

}  // namespace loom
