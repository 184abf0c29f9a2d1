// libFuzzer: the chat-template renderer through its public API: a hostile conversation (any roles,
// any bytes, any length) rendered with ChatML with and without the generation prompt, and
// detect_chat_template (which parses the template text it finds) over a hostile
// tokenizer_config.json / config.json. An input whose first string is "jinja" carries a hostile
// template instead (up to 1 MiB: deep nesting, huge numbers, repetition; dictionary
// fuzz_chat_template.dict), parsed and rendered over the conversation that follows under limits
// tighter than the defaults (the same checks, reached sooner: the fuzzer stays fast); it must end
// in a rendered text or an error, within the limits.
#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "text/chat_template.h"
#include "text/jinja.h"

namespace {

void render_hostile_template(const std::string& source, const std::vector<loom::ChatMessage>& messages, bool gen) {
  loom::jinja::Limits limits;
  limits.max_steps = 1'000'000;
  limits.max_output_bytes = limits.max_value_bytes = 4 << 20;
  auto t = loom::jinja::Template::parse(source, limits);
  if (!t.ok()) return;
  std::vector<loom::jinja::Value> list;
  for (size_t i = 0; i < messages.size(); ++i) {
    auto m = std::make_shared<loom::jinja::Dict>();
    m->set("role", loom::jinja::Value::string(messages[i].role));
    m->set("content", loom::jinja::Value::string(messages[i].content, {{0, messages[i].content.size(), static_cast<int>(i)}}));
    list.push_back(loom::jinja::Value::dict(std::move(m)));
  }
  auto r = t->render({{"messages", loom::jinja::Value::list(std::move(list))},
                      {"add_generation_prompt", loom::jinja::Value::boolean(gen)},
                      {"bos_token", loom::jinja::Value::string("<s>")}});
  if (!r.ok()) return;
  LOOM_FUZZ_CHECK(r->text.size() <= limits.max_output_bytes);
  for (const auto& m : r->marks) LOOM_FUZZ_CHECK(m.begin <= m.end && m.end <= r->text.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  static const char* kRoles[] = {"system", "user", "assistant", "tool"};
  const std::string name = in.ConsumeRandomLengthString(16);
  const std::string source = name == "jinja" ? in.ConsumeRandomLengthString(1 << 20) : std::string();
  if (source.empty()) (void)loom::parse_chat_template(name);  // a name that is not a file or chatml
  static const loom::ChatTemplate tmpl = [] {
    auto t = loom::parse_chat_template("chatml");
    LOOM_FUZZ_CHECK(t.ok());
    return *std::move(t);
  }();
  const bool gen = in.ConsumeBool();
  const std::string tokenizer_config = in.ConsumeRandomLengthString(4096);
  const std::string config = in.ConsumeRandomLengthString(1024);
  std::vector<loom::ChatMessage> messages;
  while (in.remaining_bytes() > 0 && messages.size() < 64) {
    loom::ChatMessage m;
    m.role = in.ConsumeBool() ? std::string(kRoles[in.ConsumeIntegralInRange(0, 3)]) : in.ConsumeRandomLengthString(12);
    m.content = in.ConsumeRandomLengthString(2048);
    messages.push_back(std::move(m));
  }
  if (!source.empty()) return render_hostile_template(source, messages, gen), 0;
  auto r = loom::render_chat(tmpl, messages, gen);
  if (r.ok()) {
    size_t last = 0;
    for (auto [b, e] : r->train_spans) {
      LOOM_FUZZ_CHECK(last <= b && b <= e && e <= r->text.size());
      last = e;
    }
  }
  if (!tokenizer_config.empty() || !config.empty()) {
    static const std::string dir = loom::fuzz::scratch_subdir("chat_model");
    loom::fuzz::write_file(dir + "/tokenizer_config.json", tokenizer_config.data(), tokenizer_config.size());
    loom::fuzz::write_file(dir + "/config.json", config.data(), config.size());
    (void)loom::detect_chat_template(dir);
  }
  return 0;
}
