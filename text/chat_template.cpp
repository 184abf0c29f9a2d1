// Chat templates: the model's Jinja chat_template run by Loom's interpreter with the variables
// transformers' apply_chat_template passes (messages, add_generation_prompt, the special tokens,
// tools, documents=None). Each assistant message's content (and the strings of its tool calls) is a
// tagged string, so the interpreter's marks say where it landed in the output however the template
// trims or splits it; that range plus the end-of-turn marker after it is the message's train span.
#include "text/chat_template.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/gguf.h"
#include "engine/status_macros.h"
#include "nlohmann/json.hpp"
#include "text/gguf_tokenizer.h"
#include "text/jinja.h"

namespace loom {
namespace {

using nlohmann::json;

// ChatML as transformers' documentation gives it (no default system prompt).
constexpr const char* kChatML =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// End-of-turn markers of the common families, used when the template's text contains them.
constexpr const char* kKnownEndOfTurn[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>",
                                           "<|end|>",    "</s>",       "<|endoftext|>", "<|end_of_text|>"};

absl::StatusOr<std::string> read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory"));
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

absl::StatusOr<json> read_json(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  return j;
}

// A special token in tokenizer_config.json: "text", {"content": "text", ...} or null.
std::optional<std::string> token_text(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& t = config[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  return std::nullopt;
}

// The chat template of a tokenizer_config.json object: a string, or the "default" of a list.
absl::StatusOr<std::optional<std::string>> config_template(const json& config, const std::string& where) {
  if (!config.is_object() || !config.contains("chat_template") || config["chat_template"].is_null())
    return std::optional<std::string>();
  const json& ct = config["chat_template"];
  if (ct.is_string()) return std::optional<std::string>(ct.get<std::string>());
  if (ct.is_array()) {
    std::string names;
    for (const json& e : ct) {
      if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e["template"].is_string())
        return absl::InvalidArgumentError(absl::StrCat(where, ": chat_template list entries need \"name\" and \"template\""));
      if (e["name"] == "default") return std::optional<std::string>(e["template"].get<std::string>());
      absl::StrAppend(&names, names.empty() ? "" : ", ", e["name"].dump());
    }
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": chat_template lists named templates (", names, ") but none is named \"default\""));
  }
  return absl::InvalidArgumentError(absl::StrCat(where, ": chat_template must be a string or a list of named templates"));
}

ChatSpecialTokens special_tokens(const json& config) {
  ChatSpecialTokens t;
  t.bos_token = token_text(config, "bos_token");
  t.eos_token = token_text(config, "eos_token");
  t.unk_token = token_text(config, "unk_token");
  t.pad_token = token_text(config, "pad_token");
  return t;
}

// generation_config.json's eos_token_id (one id or a list) as token texts, through
// tokenizer_config.json's added_tokens_decoder.
std::vector<std::string> generation_eos(const std::string& dir, const json& config) {
  std::vector<std::string> out;
  auto gen = read_json(dir + "/generation_config.json");
  if (!gen.ok() || !gen->is_object() || !gen->contains("eos_token_id")) return out;
  json ids = (*gen)["eos_token_id"];
  if (!ids.is_array()) ids = json::array({ids});
  const json decoder = config.is_object() ? config.value("added_tokens_decoder", json::object()) : json::object();
  for (const json& id : ids) {
    if (!id.is_number_integer()) continue;
    const std::string key = std::to_string(id.get<int64_t>());
    if (decoder.is_object() && decoder.contains(key) && decoder[key].is_object() && decoder[key].contains("content") &&
        decoder[key]["content"].is_string())
      out.push_back(decoder[key]["content"].get<std::string>());
  }
  return out;
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::from_source(const std::string& source, std::string origin,
                                                       ChatSpecialTokens tokens, std::vector<std::string> end_of_turn) {
  auto parsed = jinja::Template::parse(source);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat(origin, ", ", parsed.status().message()));
  ChatTemplate t;
  t.template_ = std::make_shared<const jinja::Template>(*std::move(parsed));
  t.source_ = source;
  t.origin_ = std::move(origin);
  if (tokens.eos_token) end_of_turn.push_back(*tokens.eos_token);
  for (const char* m : kKnownEndOfTurn)
    if (source.find(m) != std::string::npos) end_of_turn.emplace_back(m);
  std::sort(end_of_turn.begin(), end_of_turn.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() > b.size() : a < b;  // longest match first
  });
  end_of_turn.erase(std::unique(end_of_turn.begin(), end_of_turn.end()), end_of_turn.end());
  std::erase(end_of_turn, std::string());
  t.tokens_ = std::move(tokens);
  t.end_of_turn_ = std::move(end_of_turn);
  return t;
}

namespace {

// Tags of the marks render() puts on its input strings: an assistant message's content is tagged
// with its index, the strings of its tool calls with kToolCallTag + index.
constexpr int kToolCallTag = 1 << 24;

// A JSON value as a Jinja value, keys in the data's order; string leaves carry a mark with `tag`
// (tag < 0: none).
jinja::Value to_value(const nlohmann::ordered_json& j, int tag) {
  using jinja::Value;
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: {
      std::string str = j.get<std::string>();
      std::vector<jinja::Mark> marks;
      if (tag >= 0 && !str.empty()) marks.push_back({0, str.size(), tag});
      return Value::string(std::move(str), std::move(marks));
    }
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      for (const auto& e : j) items.push_back(to_value(e, tag));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<jinja::Dict>();
      for (const auto& [k, e] : j.items()) d->items.emplace_back(k, to_value(e, tag));
      return Value::dict(std::move(d));
    }
    default: return Value::undefined("binary JSON value");
  }
}

bool has_tool_calls(const ChatMessage& m) {
  const auto it = m.extra.find("tool_calls");
  return it != m.extra.end() && it->is_array() && !it->empty();
}

// The function names of a message's tool calls ({"function": {"name"}} or a bare {"name"}).
std::vector<std::string> tool_call_names(const ChatMessage& m) {
  std::vector<std::string> names;
  for (const auto& call : m.extra["tool_calls"]) {
    if (!call.is_object()) continue;
    const auto& f = call.contains("function") && call["function"].is_object() ? call["function"] : call;
    if (f.contains("name") && f["name"].is_string()) names.push_back(f["name"].get<std::string>());
  }
  return names;
}

}  // namespace

absl::StatusOr<jinja::Rendered> ChatTemplate::render_text(const std::vector<ChatMessage>& messages,
                                                          bool add_generation_prompt,
                                                          const nlohmann::ordered_json& tools) const {
  if (messages.empty()) return absl::InvalidArgumentError("chat has no messages");
  std::vector<jinja::Value> list;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& msg = messages[i];
    const std::string& r = msg.role;
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, " has role '", r, "' (expected system, user, assistant or tool)"));
    const bool assistant = r == "assistant";
    auto m = std::make_shared<jinja::Dict>();
    m->set("role", jinja::Value::string(r));
    std::vector<jinja::Mark> marks;
    if (assistant) marks.push_back({0, msg.content.size(), static_cast<int>(i)});
    m->set("content", jinja::Value::string(msg.content, std::move(marks)));
    for (const auto& [key, value] : msg.extra.items()) {
      if (key == "role") continue;
      const bool calls = assistant && key == "tool_calls";
      m->set(key, to_value(value, calls ? kToolCallTag + static_cast<int>(i) : -1));
    }
    list.push_back(jinja::Value::dict(std::move(m)));
  }
  std::vector<std::pair<std::string, jinja::Value>> vars = {
      {"messages", jinja::Value::list(std::move(list))},
      {"add_generation_prompt", jinja::Value::boolean(add_generation_prompt)},
      {"tools", tools.is_null() ? jinja::Value::none() : to_value(tools, -1)},
      {"documents", jinja::Value::none()},
  };
  const std::pair<const char*, const std::optional<std::string>*> toks[] = {
      {"bos_token", &tokens_.bos_token}, {"eos_token", &tokens_.eos_token},
      {"unk_token", &tokens_.unk_token}, {"pad_token", &tokens_.pad_token}};
  for (const auto& [name, value] : toks) {
    if (*value) vars.emplace_back(name, jinja::Value::string(**value));
    else if (tokens_.none_when_missing) vars.emplace_back(name, jinja::Value::none());
  }
  auto r = template_->render(vars);
  if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat(origin_, ", ", r.status().message()));
  return *std::move(r);
}

absl::StatusOr<RenderedChat> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                                  bool add_generation_prompt,
                                                  const nlohmann::ordered_json& tools) const {
  LOOM_ASSIGN_OR_RETURN(jinja::Rendered r, render_text(messages, add_generation_prompt, tools));
  RenderedChat out;
  out.text = std::move(r.text);
  std::map<int, std::pair<size_t, size_t>> by_message;  // first and last byte printed from each reply
  for (const jinja::Mark& m : r.marks) {
    const int msg = m.tag >= kToolCallTag ? m.tag - kToolCallTag : m.tag;
    auto [it, fresh] = by_message.try_emplace(msg, m.begin, m.end);
    if (!fresh) it->second = {std::min(it->second.first, m.begin), std::max(it->second.second, m.end)};
  }
  // An end-of-turn marker at k, or npos.
  auto marker_at = [&](size_t k) -> size_t {
    for (const std::string& marker : end_of_turn_)
      if (out.text.compare(k, marker.size(), marker) == 0) return marker.size();
    return std::string::npos;
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant" || !has_tool_calls(messages[i])) continue;
    // The template must print the calls: at least one function name after the conversation before.
    const std::vector<std::string> names = tool_call_names(messages[i]);
    std::optional<size_t> begin;
    if (i > 0) {
      const std::vector<ChatMessage> before(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i));
      auto prompt = render_text(before, /*add_generation_prompt=*/true, tools);
      if (prompt.ok() && out.text.starts_with(prompt->text)) begin = prompt->text.size();
    }
    const auto it = by_message.find(static_cast<int>(i));
    const size_t from = begin ? *begin : it != by_message.end() ? it->second.first : 0;
    bool printed = false;
    for (const std::string& name : names) printed |= !name.empty() && out.text.find(name, from) != std::string::npos;
    if (!printed)
      return absl::InvalidArgumentError(absl::StrCat(
          origin_, " does not render tool calls: the tool_calls of message ", i,
          " do not appear in its text (train such conversations with a template that supports tools, "
          "--chat-template)"));
    if (!begin && it == by_message.end())
      return absl::InvalidArgumentError(absl::StrCat(origin_, ": cannot find where assistant message ", i,
                                                     " (with tool_calls) starts in the rendered text"));
    size_t b = begin ? *begin : it->second.first, e = it != by_message.end() ? std::max(b, it->second.second) : b;
    // The turn ends at the first end-of-turn marker after what it printed.
    for (size_t k = e; k < out.text.size(); ++k) {
      if (const size_t n = marker_at(k); n != std::string::npos) {
        e = k + n;
        break;
      }
    }
    if (it != by_message.end()) b = std::min(b, it->second.first);
    out.train_spans.push_back({b, e});
  }
  for (auto [tag, span] : by_message) {
    if (has_tool_calls(messages[static_cast<size_t>(tag)])) continue;  // done above
    size_t k = span.second;
    while (k < out.text.size() && out.text[k] == ' ') ++k;
    if (const size_t n = marker_at(k); n != std::string::npos) span.second = k + n;
    out.train_spans.push_back(span);
  }
  std::sort(out.train_spans.begin(), out.train_spans.end());
  return out;
}

namespace {

// What a model folder or .gguf file says about its template: the source (if any), where it came
// from, its special tokens and extra end-of-turn tokens.
struct ModelTemplate {
  std::optional<std::string> source;
  std::string origin;
  ChatSpecialTokens tokens;
  std::vector<std::string> end_of_turn;
};

absl::StatusOr<ModelTemplate> read_model_template(const std::string& model_path) {
  namespace fs = std::filesystem;
  ModelTemplate out;
  if (model_path.ends_with(".gguf")) {
    LOOM_ASSIGN_OR_RETURN(const GgufFile f, GgufFile::open(model_path));
    LOOM_ASSIGN_OR_RETURN(const HfTokenizerFiles files, gguf_hf_tokenizer(f));
    LOOM_ASSIGN_OR_RETURN(out.source, config_template(files.tokenizer_config_json, model_path));
    out.origin = absl::StrCat(model_path, " tokenizer.chat_template");
    out.tokens = special_tokens(files.tokenizer_config_json);
    return out;
  }
  json config = json::object();
  const std::string config_path = model_path + "/tokenizer_config.json";
  std::error_code ec;
  if (fs::exists(config_path, ec)) {
    LOOM_ASSIGN_OR_RETURN(config, read_json(config_path));
  }
  out.tokens = special_tokens(config);
  out.end_of_turn = generation_eos(model_path, config);
  const std::string jinja_path = model_path + "/chat_template.jinja";
  if (fs::exists(jinja_path, ec)) {
    LOOM_ASSIGN_OR_RETURN(const std::string src, read_file(jinja_path));
    out.source = src;
    out.origin = jinja_path;
    return out;
  }
  LOOM_ASSIGN_OR_RETURN(out.source, config_template(config, config_path));
  out.origin = absl::StrCat(config_path, " chat_template");
  return out;
}

}  // namespace

absl::StatusOr<ChatTemplate> detect_chat_template(const std::string& model_path) {
  LOOM_ASSIGN_OR_RETURN(ModelTemplate m, read_model_template(model_path));
  if (!m.source)
    return absl::NotFoundError(absl::StrCat(model_path, model_path.ends_with(".gguf")
                                                            ? ": no tokenizer.chat_template in the GGUF metadata"
                                                            : ": the model has no chat template (neither "
                                                              "chat_template.jinja nor a chat_template in "
                                                              "tokenizer_config.json)"));
  return ChatTemplate::from_source(*m.source, m.origin, std::move(m.tokens), std::move(m.end_of_turn));
}

absl::StatusOr<ChatTemplate> parse_chat_template(const std::string& name_or_path, const std::string& model_path) {
  ModelTemplate m;
  if (!model_path.empty()) {
    LOOM_ASSIGN_OR_RETURN(m, read_model_template(model_path));
  }
  if (name_or_path == "chatml")
    return ChatTemplate::from_source(kChatML, "the built-in ChatML template", std::move(m.tokens),
                                     std::move(m.end_of_turn));
  if (!name_or_path.ends_with(".jinja"))
    return absl::InvalidArgumentError(absl::StrCat("--chat-template '", name_or_path,
                                                   "': expected a .jinja file or chatml"));
  LOOM_ASSIGN_OR_RETURN(const std::string src, read_file(name_or_path));
  return ChatTemplate::from_source(src, name_or_path, std::move(m.tokens), std::move(m.end_of_turn));
}

absl::StatusOr<ChatTemplate> training_chat_template(const std::string& model_path, const std::string& choice,
                                                    std::string* note) {
  if (!choice.empty()) return parse_chat_template(choice, model_path);
  auto t = detect_chat_template(model_path);
  if (t.ok() || !absl::IsNotFound(t.status())) return t;
  if (note)
    *note = absl::StrCat(t.status().message(),
                         "; conversations use plain ChatML, {\"instruction\"} lines the Alpaca prompt (choose with --chat-template)");
  auto chatml = parse_chat_template("chatml", model_path);
  if (chatml.ok()) chatml->fallback_ = true;
  return chatml;
}

}  // namespace loom
