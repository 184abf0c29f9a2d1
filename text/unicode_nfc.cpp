// Unicode NFC (UAX #15): decompose, order marks by combining class, recompose; plus the quick check.
// Alignment follows the Hugging Face `tokenizers` convention (see NfcSpan in unicode_nfc.h).
#include "text/unicode_nfc.h"

#include "text/tokenizer_internal.h"

#include <algorithm>
#include <cstring>

namespace loom::unicode {
namespace {

// Hangul syllables (Unicode §3.12): S = SBase + (L * VCount + V) * TCount + T.
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// A malformed UTF-8 byte b travels as kRawByte + b: a starter with no decomposition, written back as b.
constexpr uint32_t kRawByte = 0x110000;

struct Prop {
  uint8_t ccc = 0, quick_check = 0;
};

Prop prop(uint32_t cp) {
  if (cp >= 0x110000 || !((kNfcBlockBits[cp >> 14] >> ((cp >> 8) & 63)) & 1)) return {};
  const NfcProp* end = kNfcProps + kNumNfcProps;
  const NfcProp* p = std::lower_bound(kNfcProps, end, cp, [](const NfcProp& r, uint32_t c) { return r.last < c; });
  if (p == end || p->first > cp) return {};
  return {p->ccc, p->quick_check};
}

// Strict UTF-8 (no overlongs, surrogates or values past U+10FFFF); a malformed byte is kRawByte + b
// with length 1.
uint32_t decode(std::string_view s, size_t i, size_t* len) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  *len = 1;
  if (b0 < 0x80) return b0;
  size_t n;
  uint32_t cp, min;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cp = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return kRawByte + b0;
  }
  if (i + n > s.size()) return kRawByte + b0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return kRawByte + b0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kRawByte + b0;
  *len = n;
  return cp;
}

void encode(uint32_t cp, std::string* out) {
  if (cp >= kRawByte) out->push_back(static_cast<char>(cp - kRawByte));  // a malformed byte, passed through
  else tok::append_utf8(out, cp);
}

// A code point in flight: its class and the input bytes it stands for (0: inserted; see NfcSpan).
struct Ch {
  uint32_t cp;
  uint8_t ccc;
  uint32_t src;
};

// Appends the full canonical decomposition of cp (an input character of `len` bytes). The first
// code point carries the character's bytes, the rest are insertions, as in `tokenizers`.
void decompose(uint32_t cp, uint32_t len, std::vector<Ch>* out) {
  if (cp - kSBase < kSCount) {
    const uint32_t s = cp - kSBase, t = s % kTCount;
    out->push_back({kLBase + s / kNCount, 0, len});
    out->push_back({kVBase + (s % kNCount) / kTCount, 0, 0});
    if (t != 0) out->push_back({kTBase + t, 0, 0});
    return;
  }
  if (cp >= 0xC0 && cp < kRawByte) {  // nothing below U+00C0 decomposes
    const NfcDecomp* end = kNfcDecomps + kNumNfcDecomps;
    const NfcDecomp* d = std::lower_bound(kNfcDecomps, end, cp, [](const NfcDecomp& r, uint32_t c) { return r.cp < c; });
    if (d != end && d->cp == cp) {
      for (uint32_t k = 0; k < d->len; ++k) {
        const uint32_t c = kNfcDecompPool[d->offset + k];
        out->push_back({c, prop(c).ccc, k == 0 ? len : 0});
      }
      return;
    }
  }
  out->push_back({cp, prop(cp).ccc, len});
}

// The primary composite of the pair (a, b), or 0 when there is none.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a - kLBase < kLCount && b - kVBase < kVCount) return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a - kSBase < kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount) return a + (b - kTBase);
  const NfcPair* end = kNfcPairs + kNumNfcPairs;
  const NfcPair* p = std::lower_bound(kNfcPairs, end, std::make_pair(a, b), [](const NfcPair& r, std::pair<uint32_t, uint32_t> k) {
    return r.first != k.first ? r.first < k.first : r.second < k.second;
  });
  return p != end && p->first == a && p->second == b ? p->composite : 0;
}

// Stable sort of each run of non-starters by combining class (runs are short: insertion sort).
void canonical_order(std::vector<Ch>* buf) {
  Ch* v = buf->data();
  const size_t n = buf->size();
  for (size_t i = 1; i < n; ++i) {
    if (v[i].ccc == 0) continue;
    const Ch c = v[i];
    size_t j = i;
    for (; j > 0 && v[j - 1].ccc > c.ccc; --j) v[j] = v[j - 1];  // stops at starters (class 0)
    v[j] = c;
  }
}

// Canonical composition in place: each character not blocked from the last starter (no character
// between them of class 0 or of class >= its own) and forming a primary composite with it is merged
// into it; the composite stands for the input bytes of both.
void canonical_compose(std::vector<Ch>* buf) {
  constexpr size_t kNone = SIZE_MAX;
  size_t starter = kNone, w = 0;
  int last_ccc = -1;  // class of the last character kept since the starter; -1: none
  for (size_t r = 0; r < buf->size(); ++r) {
    const Ch c = (*buf)[r];
    if (starter != kNone && (last_ccc < 0 || last_ccc < c.ccc)) {
      Ch& s = (*buf)[starter];
      if (const uint32_t comp = compose(s.cp, c.cp)) {
        s.cp = comp;
        s.src += c.src;
        continue;
      }
    }
    if (c.ccc == 0) {
      starter = w;
      last_ccc = -1;
    } else if (starter != kNone) {
      last_ccc = c.ccc;
    }
    (*buf)[w++] = c;
  }
  buf->resize(w);
}

// Appends text unchanged; each character stands for itself.
void copy_verbatim(std::string_view text, std::string* out, std::vector<NfcSpan>* spans) {
  out->append(text);
  if (!spans) return;
  for (size_t i = 0; i < text.size();) {
    size_t len;
    decode(text, i, &len);
    spans->push_back({static_cast<uint32_t>(len), static_cast<uint32_t>(len)});
    i += len;
  }
}

// Appends the NFC of text, which starts at a boundary and ends at one (or at the end).
void normalize_stretch(std::string_view text, std::string* out, std::vector<NfcSpan>* spans) {
  thread_local std::vector<Ch> buf;
  buf.clear();
  for (size_t i = 0; i < text.size();) {
    size_t len;
    const uint32_t cp = decode(text, i, &len);
    decompose(cp, static_cast<uint32_t>(len), &buf);
    i += len;
  }
  canonical_order(&buf);
  canonical_compose(&buf);
  for (const Ch& c : buf) {
    const size_t before = out->size();
    encode(c.cp, out);
    if (spans) spans->push_back({static_cast<uint32_t>(out->size() - before), c.src});
  }
}

}  // namespace

uint8_t canonical_combining_class(uint32_t cp) { return prop(cp).ccc; }

bool is_nfc_quick(std::string_view text) {
  const size_t n = text.size();
  uint8_t last = 0;
  for (size_t i = 0; i < n;) {
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, text.data() + i, 8);
      if ((w & 0x8080808080808080ULL) == 0) {
        i += 8, last = 0;
        continue;
      }
    }
    size_t len;
    const uint32_t cp = decode(text, i, &len);
    i += len;
    const Prop p = prop(cp);
    if (p.quick_check != 0 || (p.ccc != 0 && p.ccc < last)) return false;
    last = p.ccc;
  }
  return true;
}

void nfc(std::string_view text, std::string* out, std::vector<NfcSpan>* spans) {
  out->clear();
  if (spans) spans->clear();
  out->reserve(text.size() + 8);
  // Only the stretches between NFC boundaries (before a class-0 character whose quick check is Yes:
  // nothing before it can reorder or compose with it) that fail the quick check are normalized; the
  // rest is copied.
  const size_t n = text.size();
  size_t done = 0;      // text[0, done) has been written
  size_t boundary = 0;  // the last boundary seen
  uint8_t last = 0;     // class of the previous character
  for (size_t i = 0; i < n;) {
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, text.data() + i, 8);
      if ((w & 0x8080808080808080ULL) == 0) {
        i += 8, boundary = i - 1, last = 0;
        continue;
      }
    }
    size_t len;
    const Prop p = prop(decode(text, i, &len));
    if (p.quick_check == 0 && (p.ccc == 0 || p.ccc >= last)) {
      if (p.ccc == 0) boundary = i;
      last = p.ccc;
      i += len;
      continue;
    }
    size_t j = i + len;  // the next boundary
    while (j < n) {
      const Prop q = prop(decode(text, j, &len));
      if (q.ccc == 0 && q.quick_check == 0) break;
      j += len;
    }
    copy_verbatim(text.substr(done, boundary - done), out, spans);
    normalize_stretch(text.substr(boundary, j - boundary), out, spans);
    done = boundary = i = j;
    last = 0;
  }
  copy_verbatim(text.substr(done), out, spans);
}

std::string nfc(std::string_view text) {
  std::string out;
  nfc(text, &out, nullptr);
  return out;
}

}  // namespace loom::unicode
