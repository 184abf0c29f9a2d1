// libFuzzer: the chat-template renderer through its public API: a hostile conversation (any roles,
// any bytes, any length) rendered with ChatML with and without the generation prompt, and
// detect_chat_template (which parses the template text it finds) over a hostile
// tokenizer_config.json / config.json.
#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "text/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  static const char* kRoles[] = {"system", "user", "assistant", "tool"};
  (void)loom::parse_chat_template(in.ConsumeRandomLengthString(16));  // a name that is not a file or chatml
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
