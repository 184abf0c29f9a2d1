// tokenizer.model read with the protocol buffer wire format (varints, fixed32 floats,
// length-delimited strings and messages): ModelProto.pieces (1), trainer_spec (2), normalizer_spec (3).
#include "text/sentencepiece_model.h"

#include <cstdint>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

// Early returns for the readers below (text/ does not see engine/status_macros.h).
#define SPM_RETURN_IF_ERROR(expr)          \
  do {                                     \
    ::absl::Status spm_s_ = (expr);        \
    if (!spm_s_.ok()) return spm_s_;       \
  } while (0)
#define SPM_CAT2_(a, b) a##b
#define SPM_CAT_(a, b) SPM_CAT2_(a, b)
#define SPM_ASSIGN_OR_RETURN_IMPL_(var, expr, tmp) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  var = *std::move(tmp)
#define SPM_ASSIGN_OR_RETURN(var, expr) SPM_ASSIGN_OR_RETURN_IMPL_(var, expr, SPM_CAT_(spm_or_, __LINE__))

namespace loom {
namespace {

enum Wire { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// One message's bytes; `where` says which message for errors ("tokenizer.model pieces[3]").
class Reader {
 public:
  Reader(std::string_view bytes, std::string where) : s_(bytes), where_(std::move(where)) {}
  bool done() const { return pos_ >= s_.size(); }
  const std::string& where() const { return where_; }

  absl::StatusOr<uint64_t> varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (pos_ >= s_.size()) return error("a varint runs past the end");
      const uint8_t b = static_cast<uint8_t>(s_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    return error("a varint is longer than 10 bytes");
  }
  // A field key: (field number, wire type).
  absl::StatusOr<std::pair<uint64_t, int>> key() {
    SPM_ASSIGN_OR_RETURN(const uint64_t k, varint());
    return std::pair{k >> 3, static_cast<int>(k & 7)};
  }
  absl::StatusOr<std::string_view> bytes() {
    SPM_ASSIGN_OR_RETURN(const uint64_t n, varint());
    if (n > s_.size() - pos_) return error(absl::StrCat("a ", n, "-byte field runs past the end"));
    const std::string_view out = s_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  absl::StatusOr<float> fixed32_float() {
    if (s_.size() - pos_ < 4) return error("a 4-byte field runs past the end");
    uint32_t bits = 0;
    for (int i = 0; i < 4; ++i) bits |= static_cast<uint32_t>(static_cast<uint8_t>(s_[pos_ + i])) << (8 * i);
    pos_ += 4;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  absl::Status skip(int wire) {
    switch (wire) {
      case kVarint: return varint().status();
      case kLengthDelimited: return bytes().status();
      case kFixed64:
      case kFixed32: {
        const size_t n = wire == kFixed64 ? 8 : 4;
        if (s_.size() - pos_ < n) return error(absl::StrCat("a ", n, "-byte field runs past the end"));
        pos_ += n;
        return absl::OkStatus();
      }
      default: return error(absl::StrCat("wire type ", wire, " (groups are not used by ModelProto)"));
    }
  }
  // The next field has wire type `want`, as field `name` must.
  absl::Status expect(int wire, int want, const char* name) {
    if (wire == want) return absl::OkStatus();
    return error(absl::StrCat(name, " has wire type ", wire, ", expected ", want));
  }
  absl::Status error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", what, " (at byte ", pos_, "); not a SentencePiece model"));
  }

 private:
  std::string_view s_;
  std::string where_;
  size_t pos_ = 0;
};

absl::Status parse_piece(Reader r, SentencePieceModel::Piece& p) {
  while (!r.done()) {
    SPM_ASSIGN_OR_RETURN(const auto k, r.key());
    const auto [field, wire] = k;
    if (field == 1) {
      SPM_RETURN_IF_ERROR(r.expect(wire, kLengthDelimited, "piece"));
      SPM_ASSIGN_OR_RETURN(const std::string_view s, r.bytes());
      p.piece = std::string(s);
    } else if (field == 2) {
      SPM_RETURN_IF_ERROR(r.expect(wire, kFixed32, "score"));
      SPM_ASSIGN_OR_RETURN(p.score, r.fixed32_float());
    } else if (field == 3) {
      SPM_RETURN_IF_ERROR(r.expect(wire, kVarint, "type"));
      SPM_ASSIGN_OR_RETURN(const uint64_t t, r.varint());
      if (t < SentencePieceModel::kNormal || t > SentencePieceModel::kByte)
        return r.error(absl::StrCat("type ", t, " is none of 1 (normal) to 6 (byte)"));
      p.type = static_cast<int>(t);
    } else {
      SPM_RETURN_IF_ERROR(r.skip(wire));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> read_bool(Reader& r, int wire, const char* name) {
  SPM_RETURN_IF_ERROR(r.expect(wire, kVarint, name));
  SPM_ASSIGN_OR_RETURN(const uint64_t v, r.varint());
  return v != 0;
}

absl::Status parse_trainer_spec(Reader r, SentencePieceModel& m) {
  while (!r.done()) {
    SPM_ASSIGN_OR_RETURN(const auto k, r.key());
    const auto [field, wire] = k;
    if (field == 3) {  // model_type
      SPM_RETURN_IF_ERROR(r.expect(wire, kVarint, "model_type"));
      SPM_ASSIGN_OR_RETURN(const uint64_t t, r.varint());
      m.model_type = static_cast<int>(std::min<uint64_t>(t, 1u << 30));
    } else if (field == 35) {
      SPM_ASSIGN_OR_RETURN(m.byte_fallback, read_bool(r, wire, "byte_fallback"));
    } else {
      SPM_RETURN_IF_ERROR(r.skip(wire));
    }
  }
  return absl::OkStatus();
}

absl::Status parse_normalizer_spec(Reader r, SentencePieceModel& m) {
  while (!r.done()) {
    SPM_ASSIGN_OR_RETURN(const auto k, r.key());
    const auto [field, wire] = k;
    if (field == 1) {
      SPM_RETURN_IF_ERROR(r.expect(wire, kLengthDelimited, "name"));
      SPM_ASSIGN_OR_RETURN(const std::string_view s, r.bytes());
      m.normalizer_name = std::string(s);
    } else if (field == 2) {
      SPM_RETURN_IF_ERROR(r.expect(wire, kLengthDelimited, "precompiled_charsmap"));
      SPM_ASSIGN_OR_RETURN(const std::string_view s, r.bytes());
      m.has_precompiled_charsmap = !s.empty();
    } else if (field == 3) {
      SPM_ASSIGN_OR_RETURN(m.add_dummy_prefix, read_bool(r, wire, "add_dummy_prefix"));
    } else if (field == 4) {
      SPM_ASSIGN_OR_RETURN(m.remove_extra_whitespaces, read_bool(r, wire, "remove_extra_whitespaces"));
    } else if (field == 5) {
      SPM_ASSIGN_OR_RETURN(m.escape_whitespaces, read_bool(r, wire, "escape_whitespaces"));
    } else {
      SPM_RETURN_IF_ERROR(r.skip(wire));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SentencePieceModel> parse_sentencepiece_model(std::string_view bytes, const std::string& where) {
  SentencePieceModel m;
  Reader r(bytes, where);
  while (!r.done()) {
    SPM_ASSIGN_OR_RETURN(const auto k, r.key());
    const auto [field, wire] = k;
    if (field >= 1 && field <= 3) {
      static constexpr const char* kNames[] = {"", "pieces", "trainer_spec", "normalizer_spec"};
      SPM_RETURN_IF_ERROR(r.expect(wire, kLengthDelimited, kNames[field]));
      SPM_ASSIGN_OR_RETURN(const std::string_view sub, r.bytes());
      if (field == 1) {
        m.pieces.emplace_back();
        SPM_RETURN_IF_ERROR(parse_piece(Reader(sub, absl::StrCat(where, " pieces[", m.pieces.size() - 1, "]")), m.pieces.back()));
      } else if (field == 2) {
        SPM_RETURN_IF_ERROR(parse_trainer_spec(Reader(sub, absl::StrCat(where, " trainer_spec")), m));
      } else {
        SPM_RETURN_IF_ERROR(parse_normalizer_spec(Reader(sub, absl::StrCat(where, " normalizer_spec")), m));
      }
    } else {
      SPM_RETURN_IF_ERROR(r.skip(wire));
    }
  }
  if (m.pieces.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": no pieces; not a SentencePiece model"));
  return m;
}

absl::StatusOr<SentencePieceModel> load_sentencepiece_model(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open (", std::strerror(errno), ")"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_sentencepiece_model(ss.str(), path);
}

}  // namespace loom

#undef SPM_ASSIGN_OR_RETURN
#undef SPM_ASSIGN_OR_RETURN_IMPL_
#undef SPM_CAT_
#undef SPM_CAT2_
#undef SPM_RETURN_IF_ERROR
