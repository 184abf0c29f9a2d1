// Tokenizer text helpers: UTF-8 decoding, Unicode classes, GPT-2's byte-to-unicode map, and a
// hand-written matcher equivalent (under Oniguruma's leftmost-alternative backtracking semantics)
// to the Llama 3, Qwen2 and GPT-2 pre-tokenizer regexes.
#include <algorithm>

#include "text/tokenizer_internal.h"

namespace loom::tok {

// ---- Unicode classes ----

namespace {

struct AsciiTable {
  uint8_t klass[128];
  constexpr AsciiTable() : klass() {
    for (int c = 0; c < 128; ++c) {
      uint8_t k = 0;
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) k = kLetter;
      if (c >= '0' && c <= '9') k = kNumber;
      if (c == ' ' || (c >= 0x09 && c <= 0x0D)) k = kSpace;
      klass[c] = k;
    }
  }
};
constexpr AsciiTable kAscii;

}  // namespace

uint8_t unicode_class(uint32_t cp) {
  if (cp < 128) return kAscii.klass[cp];
  const UnicodeRange* end = kUnicodeRanges + kNumUnicodeRanges;
  const UnicodeRange* it =
      std::upper_bound(kUnicodeRanges, end, cp, [](uint32_t c, const UnicodeRange& r) { return c < r.first; });
  if (it == kUnicodeRanges) return 0;
  --it;
  return cp <= it->last ? it->klass : 0;
}

// ---- UTF-8 ----

uint32_t decode_utf8(std::string_view s, size_t i, size_t* len) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  size_t n;
  uint32_t cp, min;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    *len = 1;
    return 0xFFFD;
  }
  if (i + n > s.size()) {
    *len = 1;
    return 0xFFFD;
  }
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      *len = 1;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    *len = 1;
    return 0xFFFD;
  }
  *len = n;
  return cp;
}

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_lossy(std::string_view s) {
  // Unicode's "maximal subpart" rule, as Rust's from_utf8_lossy applies it: a lead byte followed by
  // a valid prefix of continuation bytes that is then cut short is one U+FFFD.
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    if (b0 < 0x80) {
      out.push_back(static_cast<char>(b0));
      ++i;
      continue;
    }
    size_t need = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      need = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      need = 2;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      need = 3;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    size_t k = 1;
    for (; k <= need && i + k < s.size(); ++k) {
      const auto b = static_cast<uint8_t>(s[i + k]);
      const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (b < l || b > h) break;
    }
    if (k == need + 1) {
      out.append(s.substr(i, need + 1));
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += k;
  }
  return out;
}

// ---- GPT-2 byte-to-unicode map ----

uint32_t byte_to_unicode(uint8_t b) {
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
  // The other 68 bytes take 256, 257, ... in byte order.
  uint32_t n = 0;
  for (int c = 0; c < b; ++c)
    if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) ++n;
  return 256 + n;
}

int unicode_to_byte(uint32_t cp) {
  static const std::vector<int> inverse = [] {
    std::vector<int> inv(512, -1);
    for (int b = 0; b < 256; ++b) inv[byte_to_unicode(static_cast<uint8_t>(b))] = b;
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

// ---- Split regexes ----

namespace {

constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// One code point of the text being split: value, byte length, class.
struct Cp {
  uint32_t cp;
  uint32_t len;
  uint8_t klass;
};

class Matcher {
 public:
  explicit Matcher(std::string_view t) : t_(t) {}

  Cp at(size_t i) const {
    const auto b = static_cast<uint8_t>(t_[i]);
    if (b < 0x80) return {b, 1, kAscii.klass[b]};
    size_t len;
    const uint32_t cp = decode_utf8(t_, i, &len);
    return {cp, static_cast<uint32_t>(len), unicode_class(cp)};
  }
  size_t size() const { return t_.size(); }
  // Consumes code points of class `k` (any of its bits) from i, at most `max`; returns the end.
  size_t run(size_t i, uint8_t k, size_t max = SIZE_MAX) const {
    for (size_t n = 0; i < t_.size() && n < max; ++n) {
      const Cp c = at(i);
      if (!(c.klass & k)) break;
      i += c.len;
    }
    return i;
  }
  // Consumes [^\s\p{L}\p{N}]+ from i.
  size_t run_other(size_t i) const {
    while (i < t_.size()) {
      const Cp c = at(i);
      if (c.klass) break;
      i += c.len;
    }
    return i;
  }
  bool is_other(size_t i) const { return i < t_.size() && at(i).klass == 0; }
  bool is_letter(size_t i) const { return i < t_.size() && (at(i).klass & kLetter); }

  // 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive (Unicode folding: U+017F long s is 's').
  size_t contraction(size_t i, bool ignore_case) const {
    if (t_[i] != '\'' || i + 1 >= t_.size()) return 0;
    auto lower = [&](size_t k, size_t* len) -> uint32_t {
      const Cp c = at(k);
      *len = c.len;
      if (!ignore_case) return c.cp;
      if (c.cp == 0x17F) return 's';
      return (c.cp >= 'A' && c.cp <= 'Z') ? c.cp + 32 : c.cp;
    };
    size_t l1, l2;
    const uint32_t a = lower(i + 1, &l1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 1 + l1;
    if ((a == 'r' || a == 'v' || a == 'l') && i + 1 + l1 < t_.size()) {
      const uint32_t b = lower(i + 1 + l1, &l2);
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 1 + l1 + l2;
    }
    return 0;
  }

  // \s*[\r\n]+ | \s+(?!\S) | \s+ starting at a whitespace code point i; `newline_alt` enables the first.
  size_t whitespace(size_t i, bool newline_alt) const {
    size_t j = i, last_nl = SIZE_MAX, last_start = i;
    while (j < t_.size()) {
      const Cp c = at(j);
      if (!(c.klass & kSpace)) break;
      if (c.cp == '\r' || c.cp == '\n') last_nl = j;
      last_start = j;
      j += c.len;
    }
    if (newline_alt && last_nl != SIZE_MAX) return last_nl + 1;
    if (j == t_.size()) return j;  // \s+(?!\S) at the end of the text
    if (last_start > i) return last_start;  // back off one code point so a non-space follows
    return j;  // \s+
  }

  size_t llama3(size_t i, size_t max_digits) const {
    if (const size_t n = contraction(i, true)) return i + n;
    const Cp c = at(i);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c.klass & kLetter) return run(i, kLetter);
    if (!(c.klass & kNumber) && c.cp != '\r' && c.cp != '\n' && is_letter(i + c.len)) return run(i + c.len, kLetter);
    // \p{N}{1,max}
    if (c.klass & kNumber) return run(i, kNumber, max_digits);
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    size_t p = i;
    if (c.cp == ' ' && is_other(i + 1)) p = i + 1;
    if (is_other(p)) {
      size_t j = run_other(p);
      while (j < t_.size() && (t_[j] == '\r' || t_[j] == '\n')) ++j;
      return j;
    }
    return whitespace(i, true);
  }

  size_t gpt2(size_t i) const {
    if (const size_t n = contraction(i, false)) return i + n;
    const Cp c = at(i);
    const size_t p = c.cp == ' ' && i + 1 < t_.size() ? i + 1 : i;
    const Cp d = at(p);
    if (d.klass & kLetter) return run(p, kLetter);
    if (d.klass & kNumber) return run(p, kNumber);
    if (d.klass == 0) return run_other(p);
    return whitespace(i, false);
  }

 private:
  std::string_view t_;
};

}  // namespace

bool parse_split_pattern(std::string_view regex, SplitPattern* out) {
  if (regex == kLlama3Regex) {
    *out = SplitPattern::kLlama3;
  } else if (regex == kQwen2Regex) {
    *out = SplitPattern::kQwen2;
  } else if (regex == kGpt2Regex) {
    *out = SplitPattern::kGpt2;
  } else {
    return false;
  }
  return true;
}

void split_pattern(std::string_view text, SplitPattern pattern, std::vector<std::pair<uint32_t, uint32_t>>* out) {
  const Matcher m(text);
  size_t i = 0;
  while (i < text.size()) {
    size_t j;
    switch (pattern) {
      case SplitPattern::kLlama3: j = m.llama3(i, 3); break;
      case SplitPattern::kQwen2: j = m.llama3(i, 1); break;
      default: j = m.gpt2(i); break;
    }
    if (j <= i) j = i + m.at(i).len;  // cannot happen with these patterns; never loop forever
    out->emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(j));
    i = j;
  }
}

}  // namespace loom::tok
