// See preference_data.h.
#include "train/preference_data.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "train/data_formats.h"

namespace loom {
namespace {

using Json = nlohmann::ordered_json;

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

// The "role"/"content" messages of a conversational field (through the SFT reader's rules).
absl::StatusOr<std::vector<ChatMessage>> messages_of(const Json& v, const char* key) {
  Json wrapper = {{"messages", v}};
  auto conv = messages_conversation(wrapper);
  if (!conv.ok()) return absl::InvalidArgumentError(absl::StrCat("\"", key, "\": ", conv.status().message()));
  return conv->messages;
}

struct Tokenized {
  std::vector<int32_t> prompt, with_chosen, with_rejected;
};

absl::StatusOr<Tokenized> tokenize_line(const Json& j, const Tokenizer& tok, const PreferenceDataOptions& o,
                                        bool* conversational) {
  if (!j.contains("chosen") || !j.contains("rejected"))
    return absl::InvalidArgumentError(
        "a preference line needs \"chosen\" and \"rejected\" (and \"prompt\", unless the two share it): TRL's "
        "{\"prompt\", \"chosen\", \"rejected\"} as strings or as lists of messages");
  const Json& c = j["chosen"];
  const Json& r = j["rejected"];
  const bool has_prompt = j.contains("prompt");
  if (c.is_string() && r.is_string() && (!has_prompt || j["prompt"].is_string())) {
    std::string prompt = has_prompt ? j["prompt"].get<std::string>() : "";
    std::string chosen = c.get<std::string>(), rejected = r.get<std::string>();
    if (!has_prompt) {  // TRL's extract_prompt for strings: up to the last space before they differ
      size_t i = 0;
      while (i < chosen.size() && i < rejected.size() && chosen[i] == rejected[i]) ++i;
      if (i > 0 && i < chosen.size() && chosen[i - 1] != ' ') {
        const size_t sp = chosen.rfind(' ', i - 1);
        i = sp == std::string::npos ? 0 : sp;
      }
      prompt = chosen.substr(0, i), chosen = chosen.substr(i), rejected = rejected.substr(i);
    }
    // TRL appends the EOS token's text to a completion that does not end with it.
    if (const auto eos = tok.eos_id()) {
      const std::string e = tok.id_to_token(*eos);
      if (!chosen.ends_with(e)) chosen += e;
      if (!rejected.ends_with(e)) rejected += e;
    }
    Tokenized t;
    t.prompt = tok.encode(prompt, /*add_special_tokens=*/true);
    t.with_chosen = tok.encode(prompt + chosen, true);
    t.with_rejected = tok.encode(prompt + rejected, true);
    return t;
  }
  if (!c.is_array() || !r.is_array())
    return absl::InvalidArgumentError(absl::StrCat("\"chosen\" and \"rejected\" must both be strings or both lists of ",
                                                   "messages, got ", c.type_name(), " and ", r.type_name()));
  *conversational = true;
  if (!o.chat_template.ok())
    return absl::Status(o.chat_template.status().code(),
                        absl::StrCat("the chat template cannot be used: ", o.chat_template.status().message()));
  std::vector<ChatMessage> prompt, chosen, rejected;
  if (has_prompt) {
    if (!j["prompt"].is_array())
      return absl::InvalidArgumentError(absl::StrCat("\"prompt\" must be a list of messages when \"chosen\" is, got ",
                                                     j["prompt"].type_name()));
    auto p = messages_of(j["prompt"], "prompt");
    if (!p.ok()) return p.status();
    prompt = *p;
  }
  auto cm = messages_of(c, "chosen");
  if (!cm.ok()) return cm.status();
  auto rm = messages_of(r, "rejected");
  if (!rm.ok()) return rm.status();
  chosen = *cm, rejected = *rm;
  if (!has_prompt) {  // TRL's implicit prompt: the shared whole messages
    size_t i = 0;
    while (i < chosen.size() && i < rejected.size() && chosen[i].role == rejected[i].role &&
           chosen[i].content == rejected[i].content && chosen[i].extra == rejected[i].extra)
      ++i;
    prompt.assign(chosen.begin(), chosen.begin() + i);
    chosen.erase(chosen.begin(), chosen.begin() + i);
    rejected.erase(rejected.begin(), rejected.begin() + i);
  }
  if (chosen.empty() || rejected.empty())
    return absl::InvalidArgumentError("\"chosen\" and \"rejected\" must each add at least one message to the prompt");
  const ChatTemplate& tmpl = *o.chat_template;
  auto render = [&](const std::vector<ChatMessage>& m, bool gen) -> absl::StatusOr<std::vector<int32_t>> {
    auto rendered = tmpl.render(m, gen);
    if (!rendered.ok()) return rendered.status();
    return tok.encode(rendered->text, /*add_special_tokens=*/false);
  };
  Tokenized t;
  auto p = render(prompt, true);
  if (!p.ok()) return p.status();
  std::vector<ChatMessage> pc = prompt, pr = prompt;
  pc.insert(pc.end(), chosen.begin(), chosen.end());
  pr.insert(pr.end(), rejected.begin(), rejected.end());
  auto wc = render(pc, false);
  if (!wc.ok()) return wc.status();
  auto wr = render(pr, false);
  if (!wr.ok()) return wr.status();
  t.prompt = *std::move(p), t.with_chosen = *std::move(wc), t.with_rejected = *std::move(wr);
  return t;
}

}  // namespace

absl::StatusOr<std::vector<PreferenceExample>> load_preference_jsonl(const std::string& path, const Tokenizer& tok,
                                                                     const PreferenceDataOptions& o,
                                                                     PreferenceStats* stats) {
  PreferenceStats local;
  PreferenceStats& st = stats ? *stats : local;
  st = PreferenceStats{};
  std::vector<PreferenceExample> out;
  auto fn = [&](const Json& j, int64_t) -> absl::Status {
    bool conversational = false;
    auto t = tokenize_line(j, tok, o, &conversational);
    if (!t.ok()) return t.status();
    // The completion starts where the prompt's tokens stop being a prefix of both sequences.
    const size_t n = std::min({t->prompt.size(), common_prefix(t->prompt, t->with_chosen),
                               common_prefix(t->prompt, t->with_rejected)});
    PreferenceExample e;
    e.prompt.assign(t->prompt.begin(), t->prompt.begin() + static_cast<std::ptrdiff_t>(n));
    e.chosen.assign(t->with_chosen.begin() + static_cast<std::ptrdiff_t>(n), t->with_chosen.end());
    e.rejected.assign(t->with_rejected.begin() + static_cast<std::ptrdiff_t>(n), t->with_rejected.end());
    if (e.chosen.empty() || e.rejected.empty())
      return absl::InvalidArgumentError("a completion has no tokens after the prompt");
    bool cut = false;
    if (o.max_prompt_len > 0 && static_cast<int64_t>(e.prompt.size()) > o.max_prompt_len) {
      e.prompt.erase(e.prompt.begin(), e.prompt.end() - o.max_prompt_len);  // keep the end
      cut = true;
    }
    if (o.max_len > 0) {
      if (static_cast<int64_t>(e.prompt.size()) >= o.max_len) {  // TRL drops these
        ++st.dropped_too_long;
        return absl::OkStatus();
      }
      const size_t room = static_cast<size_t>(o.max_len) - e.prompt.size();
      for (std::vector<int32_t>* v : {&e.chosen, &e.rejected})
        if (v->size() > room) v->resize(room), cut = true;
    }
    st.truncated += cut;
    st.conversations += conversational;
    st.prompt_tokens += 2 * static_cast<int64_t>(e.prompt.size());
    st.completion_tokens += static_cast<int64_t>(e.chosen.size() + e.rejected.size());
    ++st.pairs;
    out.push_back(std::move(e));
    return absl::OkStatus();
  };
  if (absl::Status s = for_each_jsonl_object(path, o.skip_bad_lines, o.max_file_bytes, fn, &st.lines, &st.skipped); !s.ok())
    return s;
  if (out.empty())
    return absl::InvalidArgumentError(absl::StrCat(path, ": no preference pairs (", st.lines, " non-blank lines, ",
                                                   st.skipped, " skipped as bad, ", st.dropped_too_long,
                                                   " with a prompt of --max-len tokens or more)"));
  return out;
}

}  // namespace loom
