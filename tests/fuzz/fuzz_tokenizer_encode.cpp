// libFuzzer: the fixture tokenizers (byte-level BPE: Llama 3, Qwen2; SentencePiece BPE: Llama 2, Gemma)
// encode arbitrary bytes (invalid UTF-8 included) and decode arbitrary ids.
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "text/tokenizer.h"

namespace {
const std::vector<loom::Tokenizer>& tokenizers() {
  static const std::vector<loom::Tokenizer> all = [] {
    std::vector<loom::Tokenizer> v;
    for (const char* name : {"llama3", "qwen2", "llama2", "gemma"}) {
      auto t = loom::Tokenizer::load(loom::fuzz::fixture(std::string("tokenizers/") + name + "/tokenizer.json"));
      LOOM_FUZZ_CHECK(t.ok());
      v.push_back(*std::move(t));
    }
    return v;
  }();
  return all;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const loom::Tokenizer& tok = tokenizers()[data[0] % 4];
  const bool special = data[0] & 4;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<std::pair<size_t, size_t>> offsets;
  std::vector<int32_t> ids = tok.encode_with_offsets(text, special, &offsets);
  LOOM_FUZZ_CHECK(offsets.size() == ids.size());
  for (auto [b, e] : offsets) LOOM_FUZZ_CHECK(b <= e && e <= text.size());
  for (int32_t id : ids) LOOM_FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  (void)tok.decode(ids, special);
  // The same bytes as ids (any value, negative and out of range included).
  std::vector<int32_t> raw((size - 1) / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
  (void)tok.decode(raw, special);
  for (int32_t id : raw) (void)tok.id_to_token(id);
  return 0;
}
