// SentencePiece's tokenizer.model (a ModelProto protocol buffer) read by hand, without a protobuf
// library: the pieces (text, score, type) and the trainer / normalizer settings that decide whether
// llama.cpp's SentencePiece ("llama") vocabulary can hold the model.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loom {

struct SentencePieceModel {
  // ModelProto.SentencePiece.Type, the numbers llama.cpp's token types reuse.
  enum Type { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };
  // TrainerSpec.ModelType.
  enum ModelType { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };
  struct Piece {
    std::string piece;
    float score = 0.0f;
    int type = kNormal;
  };
  std::vector<Piece> pieces;  // by id
  // The proto's defaults where a field is absent (SentencePiece writes only what differs).
  int model_type = kUnigram;
  bool byte_fallback = false;
  std::string normalizer_name;
  bool has_precompiled_charsmap = false;  // a Unicode normalization table (nmt_nfkc, ...)
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

// `bytes` is the file's content, `where` names it in errors. InvalidArgument for what is not a
// ModelProto: a truncated field, a varint over 10 bytes, a wire type the field cannot have, a piece
// type outside 1-6, a file without pieces. Fields Loom does not need are skipped.
absl::StatusOr<SentencePieceModel> parse_sentencepiece_model(std::string_view bytes, const std::string& where);
// The file at `path`; NotFound when it cannot be read.
absl::StatusOr<SentencePieceModel> load_sentencepiece_model(const std::string& path);

}  // namespace loom
