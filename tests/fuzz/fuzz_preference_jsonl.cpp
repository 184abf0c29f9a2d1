// libFuzzer: preference pairs JSONL (TRL's {"prompt","chosen","rejected"} as strings or messages, the
// implicit prompt) read by load_preference_jsonl with the Qwen2 fixture tokenizer and ChatML, then
// batched by the PairLoader; the file's size picks skip_bad_lines and the truncation limits, so
// every option meets hostile lines.
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "text/tokenizer.h"
#include "train/pair_loader.h"
#include "train/preference_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loom::Tokenizer tok = [] {
    auto t = loom::Tokenizer::load(loom::fuzz::fixture("tokenizers/qwen2/tokenizer.json"));
    LOOM_FUZZ_CHECK(t.ok());
    return *std::move(t);
  }();
  static const loom::ChatTemplate chatml = [] {
    auto t = loom::parse_chat_template("chatml");
    LOOM_FUZZ_CHECK(t.ok());
    return *std::move(t);
  }();
  static const std::string path = loom::fuzz::scratch_dir() + "/pairs.jsonl";
  loom::fuzz::write_file(path, data, size);
  loom::PreferenceDataOptions o;
  o.chat_template = chatml;
  o.skip_bad_lines = (size / 3) % 2;
  o.max_len = (size / 6) % 2 ? 24 : 0;
  o.max_prompt_len = (size / 12) % 2 ? 8 : 0;
  loom::PreferenceStats stats;
  auto pairs = loom::load_preference_jsonl(path, tok, o, &stats);
  if (!pairs.ok()) return 0;
  LOOM_FUZZ_CHECK(stats.pairs == static_cast<int64_t>(pairs->size()));
  for (const loom::PreferenceExample& e : *pairs) {
    LOOM_FUZZ_CHECK(!e.chosen.empty() && !e.rejected.empty());
    if (o.max_len) LOOM_FUZZ_CHECK(static_cast<int64_t>(e.prompt.size() + e.chosen.size()) <= o.max_len);
    if (o.max_prompt_len) LOOM_FUZZ_CHECK(static_cast<int64_t>(e.prompt.size()) <= o.max_prompt_len);
    for (const auto* v : {&e.prompt, &e.chosen, &e.rejected})
      for (int32_t id : *v) LOOM_FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  }
  // Both layouts: every sequence inside one row of the batch, the padded one a row each.
  for (loom::PairLayout layout : {loom::PairLayout::kPad, loom::PairLayout::kPack}) {
    loom::PairLoader loader(*pairs, 3, 7, 0, layout, 2);
    const loom::Batch b = loader.next();
    const int64_t W = b.input_ids.size(1), rows = b.input_ids.size(0);
    LOOM_FUZZ_CHECK(b.pairs >= 1 && b.seq_start.size() == static_cast<size_t>(2 * b.pairs));
    if (layout == loom::PairLayout::kPad) LOOM_FUZZ_CHECK(rows == 2 * ((b.pairs + 1) / 2) * 2);
    for (size_t j = 0; j < b.seq_start.size(); ++j)
      LOOM_FUZZ_CHECK(b.seq_start[j] >= 0 && b.seq_start[j] % W + b.seq_len[j] <= W && b.seq_start[j] < rows * W);
  }
  return 0;
}
