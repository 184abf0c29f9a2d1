// libFuzzer: training data JSONL ({"text"}, {"messages"} through each chat template,
// {"prompt","completion"}) read by load_jsonl with the Qwen2 fixture tokenizer and ChatML; the
// file's size picks skip_bad_lines and a max_tokens, so every option meets hostile lines.
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "text/tokenizer.h"
#include "train/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loom::Tokenizer tok = [] {
    auto t = loom::Tokenizer::load(loom::fuzz::fixture("tokenizers/qwen2/tokenizer.json"));
    LOOM_FUZZ_CHECK(t.ok());
    return *std::move(t);
  }();
  static const std::string path = loom::fuzz::scratch_dir() + "/data.jsonl";
  loom::fuzz::write_file(path, data, size);
  loom::DataOptions o;
  static const loom::ChatTemplate chatml = [] {
    auto t = loom::parse_chat_template("chatml");
    LOOM_FUZZ_CHECK(t.ok());
    return *std::move(t);
  }();
  o.chat_template = chatml;
  o.skip_bad_lines = (size / 3) % 2;
  o.max_tokens = (size / 6) % 2 ? 16 : 0;
  loom::DataStats stats;
  auto examples = loom::load_jsonl(path, tok, o, &stats);
  if (!examples.ok()) return 0;
  for (const loom::Example& e : *examples) {
    LOOM_FUZZ_CHECK(e.ids.size() == e.target.size());
    if (o.max_tokens) LOOM_FUZZ_CHECK(static_cast<int64_t>(e.ids.size()) <= o.max_tokens);
    for (int32_t id : e.ids) LOOM_FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  }
  return 0;
}
