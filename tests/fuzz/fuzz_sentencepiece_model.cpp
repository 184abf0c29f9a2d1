// libFuzzer: the hand-written tokenizer.model (SentencePiece ModelProto) reader over hostile bytes.
// Every model it accepts has pieces, each of a type SentencePiece defines.
#include <string_view>

#include "tests/fuzz/fuzz_util.h"
#include "text/sentencepiece_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto m = loom::parse_sentencepiece_model(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.model");
  if (!m.ok()) return 0;
  LOOM_FUZZ_CHECK(!m->pieces.empty());
  for (const auto& p : m->pieces) {
    LOOM_FUZZ_CHECK(p.type >= loom::SentencePieceModel::kNormal && p.type <= loom::SentencePieceModel::kByte);
    LOOM_FUZZ_CHECK(p.piece.size() <= size);
  }
  return 0;
}
