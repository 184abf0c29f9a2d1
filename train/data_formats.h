// The conversational shapes of a training JSONL line (internal to train/): {"messages"} (with tool
// calls), ShareGPT {"conversations"} and Alpaca {"instruction","input","output"}, each turned into
// a tokenized Example with the loss on the assistant's turns.
#pragma once
#include <functional>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "train/data.h"

namespace loom {

// What a line needed, for DataStats.
struct LineInfo {
  bool conversation = false;     // rendered with the chat template
  bool template_failed = false;  // the line needed the chat template and it did not parse
};

// A conversation as the template gets it.
struct Conversation {
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools = nullptr;  // the line's "tools" (null = None)
};
// The line's messages as transformers passes them: role, content (null when a tool-call turn has
// none) and every other key (tool_calls, name, tool_call_id, ...) as given.
absl::StatusOr<Conversation> messages_conversation(const nlohmann::ordered_json& line);
// ShareGPT turns mapped to roles: human/user/input -> user, gpt/assistant/output/model -> assistant,
// system -> system, tool/observation -> tool, function_call (its value a JSON {"name","arguments"}
// or a list of them) -> an assistant turn with tool_calls; a top-level "system" goes first.
absl::StatusOr<Conversation> sharegpt_conversation(const nlohmann::ordered_json& line);

struct AlpacaRecord {
  std::string instruction, input, output, system;
};
absl::StatusOr<AlpacaRecord> alpaca_record(const nlohmann::ordered_json& line);
// With a chat template: a system turn (when "system" is set), a user turn (the instruction, then
// "\n" and the input when there is one, as LLaMA-Factory's Alpaca converter and Axolotl's
// alpaca_chat join them) and an assistant turn (the output).
Conversation alpaca_conversation(const AlpacaRecord& r);

enum class LineShape { kMessages, kShareGpt, kAlpaca };
// Tokenizes a conversational line. Alpaca lines without a chat template (DataOptions's NotFound or
// the ChatML fallback) get the classic Alpaca prompt (loss on the output and EOS). Errors name the
// key that is missing or has the wrong type; the caller adds "<file>:<line>: ".
absl::StatusOr<Example> example_from_line(LineShape shape, const nlohmann::ordered_json& line, const Tokenizer& tok,
                                          const DataOptions& options, LineInfo* info);

// The classic Alpaca prompt (Stanford Alpaca's wording, with Axolotl's and Unsloth's "\n" after
// "### Response:"); a non-empty system replaces the first paragraph.
std::string alpaca_prompt(const std::string& instruction, const std::string& input, const std::string& system);

// Each non-blank line of a JSONL file as a JSON object, with the training data's limits (a folder, a
// file over max_file_bytes (0: default_max_data_bytes()), a line over 64 MiB, invalid UTF-8 and
// malformed JSON are errors), handed to fn with its 1-based line number. An error of a line (fn's
// included) is returned as "<file>:<line>: ..." or, with skip_bad_lines, counted in *skipped.
// *lines counts the non-blank lines.
using JsonlObjectFn = std::function<absl::Status(const nlohmann::ordered_json& line, int64_t lineno)>;
absl::Status for_each_jsonl_object(const std::string& path, bool skip_bad_lines, int64_t max_file_bytes,
                                   const JsonlObjectFn& fn, int64_t* lines, int64_t* skipped);

}  // namespace loom
