// libFuzzer: tokenizer.json loading (models, normalizers, pre-tokenizers, merges, added tokens);
// a tokenizer that loads then encodes and decodes the first bytes of its own file.
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_util.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = loom::fuzz::scratch_dir() + "/tokenizer.json";
  loom::fuzz::write_file(path, data, size);
  auto tok = loom::Tokenizer::load(path);
  if (!tok.ok()) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size < 512 ? size : 512);
  for (bool special : {false, true}) {
    std::vector<std::pair<size_t, size_t>> offsets;
    std::vector<int32_t> ids = tok->encode_with_offsets(text, special, &offsets);
    LOOM_FUZZ_CHECK(offsets.size() == ids.size());
    for (auto [b, e] : offsets) LOOM_FUZZ_CHECK(b <= e && e <= text.size());
    for (int32_t id : ids) LOOM_FUZZ_CHECK(id >= 0 && id < tok->vocab_size());
    (void)tok->decode(ids, special);
  }
  for (int32_t id : {-1, 0, 1, static_cast<int32_t>(tok->vocab_size()) - 1, static_cast<int32_t>(tok->vocab_size())})
    (void)tok->id_to_token(id);
  return 0;
}
