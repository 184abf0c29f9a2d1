// Conversational JSONL shapes: {"messages"} as transformers' apply_chat_template takes them (tool
// calls and a top-level "tools" included), ShareGPT {"conversations"} mapped to roles as Unsloth's
// standardize_sharegpt does, and Alpaca; rendered with the chat template, loss on assistant turns.
#include "train/data_formats.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"

namespace loom {
namespace {

using Json = nlohmann::ordered_json;

absl::Status bad(const std::string& where, const std::string& what, const Json& v) {
  return absl::InvalidArgumentError(absl::StrCat(where, " must be ", what, ", got ", v.type_name()));
}

// A string field: missing is "has no", another type names the type found.
absl::StatusOr<std::string> string_field(const Json& obj, const char* key, const std::string& where) {
  if (!obj.contains(key)) return absl::InvalidArgumentError(absl::StrCat(where, " has no \"", key, "\""));
  const Json& v = obj[key];
  if (!v.is_string()) return bad(absl::StrCat(where, ": \"", key, "\""), "a string", v);
  return v.get<std::string>();
}

// The chat template a conversational line needs; its error (a template that does not parse, a
// model whose files cannot be read) is the line's error and is noted in info.
absl::StatusOr<const ChatTemplate*> need_template(const DataOptions& options, LineInfo* info) {
  if (!options.chat_template.ok()) {
    info->template_failed = true;
    return absl::Status(options.chat_template.status().code(),
                        absl::StrCat("the chat template cannot be used: ", options.chat_template.status().message()));
  }
  return &*options.chat_template;
}

// Checks tool_calls as transformers' documented shape: a list of {"type": "function", "function":
// {"name": str, "arguments": dict or JSON string}} (a bare {"name", "arguments"} is accepted too).
absl::Status check_tool_calls(const Json& calls, const std::string& where) {
  if (!calls.is_array()) return bad(where, "an array", calls);
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string at = absl::StrCat(where, "[", k, "]");
    const Json& c = calls[k];
    if (!c.is_object()) return bad(at, "an object", c);
    const bool nested = c.contains("function");
    const Json& f = nested ? c["function"] : c;
    const std::string fat = nested ? at + ".function" : at;
    if (!f.is_object()) return bad(fat, "an object", f);
    if (!f.contains("name")) return absl::InvalidArgumentError(absl::StrCat(fat, " has no \"name\""));
    if (!f["name"].is_string()) return bad(fat + ".name", "a string", f["name"]);
    if (f.contains("arguments") && !f["arguments"].is_object() && !f["arguments"].is_string())
      return bad(fat + ".arguments", "an object or a JSON string", f["arguments"]);
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> top_level_tools(const Json& line) {
  if (!line.contains("tools") || line["tools"].is_null()) return Json(nullptr);
  Json tools = line["tools"];
  if (tools.is_string()) {  // LLaMA-Factory's ShareGPT keeps them as a JSON string
    tools = Json::parse(tools.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (tools.is_discarded()) return absl::InvalidArgumentError("\"tools\" is a string but not JSON");
  }
  if (!tools.is_array()) return bad("\"tools\"", "an array", tools);
  return tools;
}

// Tokenizes a rendered conversation: a token is a target when its (non-empty) byte range lies
// inside one train span.
absl::StatusOr<Example> example_from_chat(const std::vector<ChatMessage>& chat, const Json& tools, const Tokenizer& tok,
                                          const DataOptions& options, LineInfo* info) {
  auto tmpl = need_template(options, info);
  if (!tmpl.ok()) return tmpl.status();
  info->conversation = true;
  auto rendered = (*tmpl)->render(chat, /*add_generation_prompt=*/false, tools);
  if (!rendered.ok()) return rendered.status();
  std::vector<std::pair<size_t, size_t>> offsets;
  Example ex;
  ex.ids = tok.encode_with_offsets(rendered->text, /*add_special_tokens=*/false, &offsets);
  ex.target.assign(ex.ids.size(), 0);
  size_t s = 0;
  const auto& spans = rendered->train_spans;
  for (size_t i = 0; i < ex.ids.size() && i < offsets.size(); ++i) {
    const auto [b, e] = offsets[i];
    if (e <= b) continue;
    while (s < spans.size() && spans[s].second <= b) ++s;  // offsets are non-decreasing
    if (s < spans.size() && b >= spans[s].first && e <= spans[s].second) ex.target[i] = 1;
  }
  return ex;
}

void append(Example* ex, const std::vector<int32_t>& ids, uint8_t target) {
  ex->ids.insert(ex->ids.end(), ids.begin(), ids.end());
  ex->target.insert(ex->target.end(), ids.size(), target);
}

constexpr const char* kAlpacaIntroInput =
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.";
constexpr const char* kAlpacaIntro =
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.";

// ShareGPT "from" values: Unsloth's standardize_sharegpt aliases (system; human, user, input; gpt,
// assistant, output), LLaMA-Factory's tool turns (function_call, observation) and "tool", "model".
// Compared case-insensitively.
std::optional<std::string> sharegpt_role(std::string from) {
  std::transform(from.begin(), from.end(), from.begin(), [](unsigned char c) { return std::tolower(c); });
  if (from == "system") return "system";
  if (from == "human" || from == "user" || from == "input") return "user";
  if (from == "gpt" || from == "assistant" || from == "output" || from == "model") return "assistant";
  if (from == "function_call") return "function_call";
  if (from == "observation" || from == "tool") return "tool";
  return std::nullopt;
}

}  // namespace

std::string alpaca_prompt(const std::string& instruction, const std::string& input, const std::string& system) {
  std::string p = !system.empty() ? system : input.empty() ? kAlpacaIntro : kAlpacaIntroInput;
  absl::StrAppend(&p, "\n\n### Instruction:\n", instruction, "\n\n");
  if (!input.empty()) absl::StrAppend(&p, "### Input:\n", input, "\n\n");
  absl::StrAppend(&p, "### Response:\n");
  return p;
}

absl::StatusOr<Conversation> messages_conversation(const Json& line) {
  const Json& messages = line["messages"];
  if (!messages.is_array()) return bad("\"messages\"", "an array", messages);
  std::vector<ChatMessage> chat;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return bad(where, "an object", m);
    ChatMessage cm;
    auto role = string_field(m, "role", where);
    if (!role.ok()) return role.status();
    cm.role = *std::move(role);
    const bool calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
    if (calls) {
      if (cm.role != "assistant")
        return absl::InvalidArgumentError(absl::StrCat(where, " has tool_calls but role \"", cm.role,
                                                       "\" (only assistant messages call tools)"));
      if (auto st = check_tool_calls(m["tool_calls"], where + ".tool_calls"); !st.ok()) return st;
    }
    if (calls && (!m.contains("content") || m["content"].is_null())) {
      cm.extra["content"] = nullptr;  // a tool-call turn without text: content None
    } else {
      auto content = string_field(m, "content", where);
      if (!content.ok()) return content.status();
      cm.content = *std::move(content);
    }
    for (const auto& [key, value] : m.items())
      if (key != "role" && key != "content") cm.extra[key] = value;
    chat.push_back(std::move(cm));
  }
  auto tools = top_level_tools(line);
  if (!tools.ok()) return tools.status();
  return Conversation{std::move(chat), *std::move(tools)};
}

absl::StatusOr<Conversation> sharegpt_conversation(const Json& line) {
  const Json& conv = line["conversations"];
  if (!conv.is_array()) return bad("\"conversations\"", "an array", conv);
  std::vector<ChatMessage> chat;
  if (line.contains("system") && !line["system"].is_null()) {  // LLaMA-Factory's "system" column
    if (!line["system"].is_string()) return bad("\"system\"", "a string", line["system"]);
    if (!line["system"].get<std::string>().empty()) chat.push_back({"system", line["system"].get<std::string>()});
  }
  for (size_t i = 0; i < conv.size(); ++i) {
    const Json& t = conv[i];
    const std::string where = absl::StrCat("conversations[", i, "]");
    if (!t.is_object()) return bad(where, "an object", t);
    auto from = string_field(t, "from", where);
    if (!from.ok()) return from.status();
    auto value = string_field(t, "value", where);
    if (!value.ok()) return value.status();
    const auto role = sharegpt_role(*from);
    if (!role)
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".from is \"", *from,
          "\" (expected human, user, gpt, assistant, system, tool, function_call or observation)"));
    if (*role != "function_call") {
      chat.push_back({*role, *std::move(value)});
      continue;
    }
    // The value is the call as JSON: {"name", "arguments"} or a list of them.
    Json call = Json::parse(*value, nullptr, /*allow_exceptions=*/false);
    if (call.is_discarded() || (!call.is_object() && !call.is_array()))
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".value of a function_call must be JSON: {\"name\": ..., \"arguments\": ...} or a list of them"));
    if (call.is_object()) call = Json::array({call});
    Json calls = Json::array();
    for (Json& c : call) calls.push_back(Json{{"type", "function"}, {"function", std::move(c)}});
    if (auto st = check_tool_calls(calls, where + ".value"); !st.ok()) return st;
    ChatMessage cm{"assistant", ""};
    cm.extra["tool_calls"] = std::move(calls);
    chat.push_back(std::move(cm));
  }
  auto tools = top_level_tools(line);
  if (!tools.ok()) return tools.status();
  return Conversation{std::move(chat), *std::move(tools)};
}

absl::StatusOr<AlpacaRecord> alpaca_record(const Json& line) {
  AlpacaRecord r;
  const std::string where = "the Alpaca line";
  auto instruction = string_field(line, "instruction", where);
  if (!instruction.ok()) return instruction.status();
  r.instruction = *std::move(instruction);
  auto output = string_field(line, "output", where);
  if (!output.ok()) return output.status();
  r.output = *std::move(output);
  for (auto [key, value] : {std::pair{"input", &r.input}, std::pair{"system", &r.system}}) {
    if (!line.contains(key) || line[key].is_null()) continue;
    if (!line[key].is_string()) return bad(absl::StrCat("\"", key, "\""), "a string", line[key]);
    *value = line[key].get<std::string>();
  }
  return r;
}

Conversation alpaca_conversation(const AlpacaRecord& r) {
  Conversation c;
  if (!r.system.empty()) c.messages.push_back({"system", r.system});
  c.messages.push_back({"user", r.input.empty() ? r.instruction : absl::StrCat(r.instruction, "\n", r.input)});
  c.messages.push_back({"assistant", r.output});
  return c;
}

absl::StatusOr<Example> example_from_line(LineShape shape, const Json& line, const Tokenizer& tok,
                                          const DataOptions& options, LineInfo* info) {
  absl::StatusOr<Conversation> conv;
  if (shape == LineShape::kAlpaca) {
    auto r = alpaca_record(line);
    if (!r.ok()) return r.status();
    const bool no_template = absl::IsNotFound(options.chat_template.status()) ||
                             (options.chat_template.ok() && options.chat_template->is_fallback());
    if (no_template) {
      Example ex;
      append(&ex, tok.encode(alpaca_prompt(r->instruction, r->input, r->system), /*add_special_tokens=*/true), 0);
      append(&ex, tok.encode(r->output, /*add_special_tokens=*/false), 1);
      if (const auto eos = tok.eos_id()) append(&ex, {*eos}, 1);
      return ex;
    }
    conv = alpaca_conversation(*r);
  } else {
    conv = shape == LineShape::kMessages ? messages_conversation(line) : sharegpt_conversation(line);
    if (!conv.ok()) return conv.status();
  }
  return example_from_chat(conv->messages, conv->tools, tok, options, info);
}

}  // namespace loom
