// Chat templates: the three families' official Jinja templates re-implemented for text messages,
// byte for byte (tests/fixtures/chat/cases.json is rendered by transformers from the .jinja files),
// plus the byte spans of each assistant reply and its end-of-turn marker (what the loss is taken on).
//
//   chatml  Qwen2.5-Instruct: "<|im_start|>role\ncontent<|im_end|>\n", content as is; without a
//           leading system message the default "You are Qwen, created by Alibaba Cloud. ..." system
//           turn is inserted (Qwen3's template differs: no default system, <think> handling).
//   llama3  Llama 3.1 Instruct: <|begin_of_text|>, a system header that always carries "Cutting
//           Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" (the template's own default
//           date_string) and then the system message; every content is trimmed; <|eot_id|>.
//   gemma   Gemma 3 it: <bos>, "<start_of_turn>role\n" with assistant -> model, contents trimmed,
//           "<end_of_turn>\n"; a system message is folded into the first turn as "system\n\n";
//           roles must alternate user/model. Without a system message this equals Gemma 2's template.
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "text/chat_template.h"

namespace loom {
namespace {

constexpr const char* kQwenDefaultSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// Length of the UTF-8 code point starting at s[i] and its value; 0 when the bytes are not valid UTF-8.
size_t decode_utf8(const std::string& s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(i + k) & 0x3F);
  }
  *cp = v;
  return n;
}

// Python's str.isspace(), which Jinja's `trim` filter (str.strip()) uses.
bool is_python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Jinja's `| trim`: strips leading and trailing Unicode whitespace.
std::string trim(const std::string& s) {
  size_t begin = 0;
  while (begin < s.size()) {
    uint32_t cp = 0;
    const size_t n = decode_utf8(s, begin, &cp);
    if (n == 0 || !is_python_space(cp)) break;
    begin += n;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;  // back up to the lead byte of the last code point
    while (start > begin && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    uint32_t cp = 0;
    const size_t n = decode_utf8(s, start, &cp);
    if (n == 0 || start + n != end || !is_python_space(cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

// Appends text; add_trained also records the byte range of content + end marker as a train span.
struct Builder {
  RenderedChat out;
  void add(const std::string& s) { out.text += s; }
  void add_trained(const std::string& content, const std::string& end_marker) {
    const size_t begin = out.text.size();
    out.text += content;
    out.text += end_marker;
    out.train_spans.emplace_back(begin, out.text.size());
  }
};

RenderedChat render_chatml(const std::vector<ChatMessage>& m, bool add_generation_prompt) {
  Builder b;
  if (m[0].role == "system") {
    b.add("<|im_start|>system\n" + m[0].content + "<|im_end|>\n");
  } else {
    b.add(absl::StrCat("<|im_start|>system\n", kQwenDefaultSystem, "<|im_end|>\n"));
  }
  for (size_t i = 0; i < m.size(); ++i) {
    if (m[i].role == "system" && i == 0) continue;  // already printed above
    b.add("<|im_start|>" + m[i].role + "\n");
    if (m[i].role == "assistant") {
      b.add_trained(m[i].content, "<|im_end|>");
      b.add("\n");
    } else {
      b.add(m[i].content + "<|im_end|>\n");
    }
  }
  if (add_generation_prompt) b.add("<|im_start|>assistant\n");
  return std::move(b.out);
}

RenderedChat render_llama3(const std::vector<ChatMessage>& m, bool add_generation_prompt) {
  Builder b;
  size_t first = 0;
  std::string system;
  if (m[0].role == "system") {
    system = trim(m[0].content);
    first = 1;
  }
  b.add("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n");
  b.add("Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
  b.add(system + "<|eot_id|>");
  for (size_t i = first; i < m.size(); ++i) {
    b.add("<|start_header_id|>" + m[i].role + "<|end_header_id|>\n\n");
    if (m[i].role == "assistant") {
      b.add_trained(trim(m[i].content), "<|eot_id|>");
    } else {
      b.add(trim(m[i].content) + "<|eot_id|>");
    }
  }
  if (add_generation_prompt) b.add("<|start_header_id|>assistant<|end_header_id|>\n\n");
  return std::move(b.out);
}

absl::StatusOr<RenderedChat> render_gemma(const std::vector<ChatMessage>& m, bool add_generation_prompt) {
  Builder b;
  size_t first = 0;
  std::string first_user_prefix;
  if (m[0].role == "system") {
    first_user_prefix = m[0].content + "\n\n";
    first = 1;
  }
  b.add("<bos>");
  for (size_t i = first; i < m.size(); ++i) {
    const size_t k = i - first;  // loop.index0 over the messages after the system one
    if ((m[i].role == "user") != (k % 2 == 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gemma chat template: conversation roles must alternate user/assistant/user/assistant/... (message ", i,
          " has role '", m[i].role, "')"));
    }
    const bool assistant = m[i].role == "assistant";
    b.add("<start_of_turn>" + std::string(assistant ? "model" : m[i].role) + "\n" + (k == 0 ? first_user_prefix : ""));
    if (assistant) {
      b.add_trained(trim(m[i].content), "<end_of_turn>");
      b.add("\n");
    } else {
      b.add(trim(m[i].content) + "<end_of_turn>\n");
    }
  }
  if (add_generation_prompt) b.add("<start_of_turn>model\n");
  return std::move(b.out);
}

absl::StatusOr<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

}  // namespace

absl::StatusOr<ChatTemplate> parse_chat_template(const std::string& name) {
  if (name == "chatml") return ChatTemplate::kChatML;
  if (name == "llama3") return ChatTemplate::kLlama3;
  if (name == "gemma") return ChatTemplate::kGemma;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown chat template '", name, "' (expected chatml, llama3 or gemma)"));
}

absl::StatusOr<ChatTemplate> detect_chat_template(const std::string& model_dir) {
  const std::string tok_path = model_dir + "/tokenizer_config.json";
  if (auto text = read_file(tok_path); text.ok()) {
    const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(tok_path, ": not valid JSON"));
    std::string tmpl;
    if (j.is_object() && j.contains("chat_template")) {
      const auto& ct = j["chat_template"];
      if (ct.is_string()) {
        tmpl = ct.get<std::string>();
      } else if (ct.is_array()) {  // [{"name": "default", "template": ...}, ...]
        for (const auto& e : ct) {
          if (e.is_object() && e.contains("template") && e["template"].is_string()) tmpl += e["template"].get<std::string>();
        }
      }
    }
    if (tmpl.find("<|im_start|>") != std::string::npos) return ChatTemplate::kChatML;
    if (tmpl.find("<|start_header_id|>") != std::string::npos) return ChatTemplate::kLlama3;
    if (tmpl.find("<start_of_turn>") != std::string::npos) return ChatTemplate::kGemma;
  }
  const std::string cfg_path = model_dir + "/config.json";
  auto text = read_file(cfg_path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(model_dir, ": no chat template found (neither tokenizer_config.json's ",
                                            "chat_template nor config.json's model_type); pass --chat-template"));
  }
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(cfg_path, ": not valid JSON"));
  if (!j.is_object() || !j.contains("model_type") || !j["model_type"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(cfg_path, ": no string model_type to pick a chat template from"));
  }
  const std::string type = j["model_type"].get<std::string>();
  if (type == "qwen2" || type == "qwen3") return ChatTemplate::kChatML;
  if (type == "llama") return ChatTemplate::kLlama3;
  if (type == "gemma" || type == "gemma2" || type == "gemma3" || type == "gemma3_text") return ChatTemplate::kGemma;
  return absl::InvalidArgumentError(absl::StrCat(cfg_path, ": no chat template known for model_type '", type,
                                                 "' (pass chatml, llama3 or gemma explicitly)"));
}

absl::StatusOr<RenderedChat> render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt) {
  if (messages.empty()) return absl::InvalidArgumentError("chat has no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, " has role '", r, "' (expected system, user or assistant)"));
    }
  }
  switch (t) {
    case ChatTemplate::kChatML: return render_chatml(messages, add_generation_prompt);
    case ChatTemplate::kLlama3: return render_llama3(messages, add_generation_prompt);
    case ChatTemplate::kGemma: return render_gemma(messages, add_generation_prompt);
  }
  return absl::InvalidArgumentError("unknown chat template");
}

}  // namespace loom
