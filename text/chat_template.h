// Chat templates: render a conversation with the model's own chat_template (Jinja, run by Loom's
// interpreter, text/jinja.h) exactly as transformers' apply_chat_template(tokenize=False) does, with
// the byte spans of each assistant reply and its end-of-turn marker (what the loss is taken on).
// Tool use as transformers passes it: assistant tool_calls, "tool" messages, a `tools` list.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace loom {

namespace jinja {
class Template;
struct Rendered;
}

struct ChatMessage {
  std::string role;  // system, user, assistant, tool
  std::string content;
  // The message's other keys as the data gives them, passed to the template as they are (as
  // transformers does): an assistant's "tool_calls" ([{"type": "function", "function": {"name",
  // "arguments"}}], arguments a dict or a JSON string), a tool result's "name" / "tool_call_id", or
  // "content": null (which then replaces content).
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

struct RenderedChat {
  std::string text;
  // Per assistant message the template prints: from the first to the last byte printed from its
  // content (as the template prints it: trimmed, its <think> part, ...), then, after any spaces,
  // an end-of-turn marker when one follows (<|im_end|>, <|eot_id|>, <end_of_turn>, </s>, ...).
  // A message with tool_calls: from where the generation prompt of the conversation before it ends
  // (else its first printed byte) to the first end-of-turn marker after its last printed byte.
  std::vector<std::pair<size_t, size_t>> train_spans;
};

// The special tokens a template sees as variables; an empty optional leaves the name undefined.
struct ChatSpecialTokens {
  std::optional<std::string> bos_token = {}, eos_token = {}, unk_token = {}, pad_token = {};
  bool none_when_missing = false;  // define absent tokens as None instead (as a caller passing None does)
};

class ChatTemplate {
 public:
  // Parses Jinja source; `origin` names where it came from in error messages. `end_of_turn` are
  // the texts that may close a reply (the eos token and the model's generation eos tokens);
  // the usual markers (<|im_end|>, <|eot_id|>, <end_of_turn>, <|end|>, </s>) are added when the
  // template's text contains them.
  static absl::StatusOr<ChatTemplate> from_source(const std::string& source, std::string origin,
                                                  ChatSpecialTokens tokens = {},
                                                  std::vector<std::string> end_of_turn = {});

  // messages must have roles system, user, assistant or tool; `tools` (a JSON list, or null for
  // None) is the template's tools variable. A template error (its raise_exception, an undefined
  // name, ...) is InvalidArgument naming the origin and the template line; so is a template that
  // prints none of an assistant message's tool calls.
  absl::StatusOr<RenderedChat> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                      const nlohmann::ordered_json& tools = nullptr) const;

  const std::string& origin() const { return origin_; }
  const std::string& source() const { return source_; }
  const ChatSpecialTokens& special_tokens() const { return tokens_; }
  const std::vector<std::string>& end_of_turn() const { return end_of_turn_; }
  // True for the ChatML that training_chat_template falls back to when the model has no template
  // and none was chosen ({"instruction"} lines then use the classic Alpaca prompt instead).
  bool is_fallback() const { return fallback_; }

 private:
  friend absl::StatusOr<ChatTemplate> training_chat_template(const std::string&, const std::string&, std::string*);
  absl::StatusOr<jinja::Rendered> render_text(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                                  const nlohmann::ordered_json& tools) const;
  std::shared_ptr<const jinja::Template> template_;
  std::string source_, origin_;
  ChatSpecialTokens tokens_;
  std::vector<std::string> end_of_turn_;
  bool fallback_ = false;
};

// The model's template: <dir>/chat_template.jinja, else tokenizer_config.json's chat_template (a
// string, or the entry named "default" of a list of named templates), with the special tokens of
// tokenizer_config.json and end-of-turn tokens from generation_config.json's eos_token_id; or a
// .gguf file's tokenizer.chat_template. NotFound when the model has none.
absl::StatusOr<ChatTemplate> detect_chat_template(const std::string& model_path);

// --chat-template: a .jinja file, or "chatml" (plain ChatML, for models without a template); with
// model_path, the model's special and end-of-turn tokens go with it.
absl::StatusOr<ChatTemplate> parse_chat_template(const std::string& name_or_path, const std::string& model_path = "");

// The template {"messages"} lines are rendered with in training (and `loom tokenize`): `choice`
// (--chat-template) when given, else the model's own, else plain ChatML, with *note saying why.
// A template that does not parse is returned as its error, for the first line that needs it.
absl::StatusOr<ChatTemplate> training_chat_template(const std::string& model_path, const std::string& choice,
                                                    std::string* note);

inline absl::StatusOr<RenderedChat> render_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt = false) {
  return t.render(messages, add_generation_prompt);
}

}  // namespace loom
