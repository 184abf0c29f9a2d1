// Chat templates: render a conversation as the model's chat template does, with the byte spans of
// each assistant reply and its end-of-turn marker (what the loss is taken on).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace loom {

enum class ChatTemplate { kChatML, kLlama3, kGemma };
absl::StatusOr<ChatTemplate> parse_chat_template(const std::string& name);  // "chatml", "llama3", "gemma"
// Picks the template from the model folder: tokenizer_config.json's chat_template text when present
// (<|im_start|> -> ChatML, <|start_header_id|> -> Llama 3, <start_of_turn> -> Gemma), else config.json's
// model_type (qwen2/qwen3 -> ChatML, llama -> Llama 3, gemma/gemma2 -> Gemma).
absl::StatusOr<ChatTemplate> detect_chat_template(const std::string& model_dir);

struct ChatMessage {
  std::string role;  // system, user, assistant
  std::string content;
};
// Renders exactly as transformers' apply_chat_template(messages, tokenize=False) does with that
// family's official template; also returns the byte spans of the text the loss is taken on
// (each assistant reply and its end-of-turn marker).
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> train_spans;
};
absl::StatusOr<RenderedChat> render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt = false);

}  // namespace loom
