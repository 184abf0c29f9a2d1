// Chat templates: render a conversation with the model's own chat_template (Jinja, run by Loom's
// interpreter, text/jinja.h) exactly as transformers' apply_chat_template(tokenize=False) does, with
// the byte spans of each assistant reply and its end-of-turn marker (what the loss is taken on).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace loom {

namespace jinja {
class Template;
}

struct ChatMessage {
  std::string role;  // system, user, assistant
  std::string content;
};

struct RenderedChat {
  std::string text;
  // Per assistant message the template prints: from the first to the last byte printed from its
  // content (as the template prints it: trimmed, its <think> part, ...), then, after any spaces,
  // an end-of-turn marker when one follows (<|im_end|>, <|eot_id|>, <end_of_turn>, </s>, ...).
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

  // messages must have roles system, user or assistant. A template error (its raise_exception,
  // an undefined name, ...) is InvalidArgument naming the origin and the template line.
  absl::StatusOr<RenderedChat> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  const std::string& origin() const { return origin_; }
  const std::string& source() const { return source_; }
  const ChatSpecialTokens& special_tokens() const { return tokens_; }
  const std::vector<std::string>& end_of_turn() const { return end_of_turn_; }

 private:
  std::shared_ptr<const jinja::Template> template_;
  std::string source_, origin_;
  ChatSpecialTokens tokens_;
  std::vector<std::string> end_of_turn_;
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
