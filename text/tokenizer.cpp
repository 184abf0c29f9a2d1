// Tokenizer: runs the `tokenizers` pipeline — added-token split, normalizers, pre-tokenizer, BPE
// model, post-processor — and the decoder chain (loading: tokenizer_load.cpp).
#include "text/tokenizer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "text/tokenizer_pipeline_internal.h"
#include "text/unicode_nfc.h"

namespace loom {

namespace {

bool is_cont(char c) { return (static_cast<uint8_t>(c) & 0xC0) == 0x80; }

// tokenizers' Digits pre-tokenizer (numbers, \p{N}, isolated: one per piece when `individual`,
// else maximal runs), then the split regex inside each stretch between them.
void split_digits(std::string_view input, tok::SplitPattern pattern, bool individual,
                  std::vector<std::pair<uint32_t, uint32_t>>* out) {
  std::vector<std::pair<uint32_t, uint32_t>> sub;
  size_t i = 0, start = 0;
  auto flush = [&](size_t end) {
    if (end <= start) return;
    sub.clear();
    tok::split_pattern(input.substr(start, end - start), pattern, &sub);
    for (const auto& [b, e] : sub) out->emplace_back(static_cast<uint32_t>(b + start), static_cast<uint32_t>(e + start));
  };
  auto is_number = [&](size_t at, size_t* len) { return (tok::unicode_class(tok::decode_utf8(input, at, len)) & tok::kNumber) != 0; };
  while (i < input.size()) {
    size_t len;
    if (!is_number(i, &len)) {
      i += len;
      continue;
    }
    flush(i);
    size_t j = i + len;
    while (!individual && j < input.size() && is_number(j, &len)) j += len;
    out->emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(j));
    i = start = j;
  }
  flush(input.size());
}

// Normalizer edits with tokenizers' alignments: prepended bytes take the first character's range;
// a replacement takes the range of the text it replaces.
void prepend(const Normalized& n, const std::string& text, bool track, Normalized* o) {
  o->s = text + n.s;
  if (!track) return;
  o->begin.assign(text.size(), n.begin[0]);
  o->end.assign(text.size(), n.end[0]);
  o->begin.insert(o->begin.end(), n.begin.begin(), n.begin.end());
  o->end.insert(o->end.end(), n.end.begin(), n.end.end());
}

void replace_all(const Normalized& n, const std::string& pattern, const std::string& content, bool track,
                 Normalized* o) {
  for (size_t i = 0; i < n.s.size();) {
    if (n.s[i] == pattern[0] && n.s.compare(i, pattern.size(), pattern) == 0) {
      o->s += content;
      if (track) {
        o->begin.insert(o->begin.end(), content.size(), n.begin[i]);
        o->end.insert(o->end.end(), content.size(), n.end[i + pattern.size() - 1]);
      }
      i += pattern.size();
    } else {
      o->s.push_back(n.s[i]);
      if (track) {
        o->begin.push_back(n.begin[i]);
        o->end.push_back(n.end[i]);
      }
      ++i;
    }
  }
}

}  // namespace

// ---- Encoding ----

// Leftmost-longest match of the added tokens (as tokenizers' Aho-Corasick split), with the
// single_word / lstrip / rstrip rules.
void Tokenizer::Impl::split_added(std::string_view text, std::vector<Segment>* out) const {
  size_t last = 0, i = 0;
  const size_t n = text.size();
  auto word_char = [&](size_t at) {
    size_t len;
    const uint32_t cp = tok::decode_utf8(text, at, &len);
    return cp == '_' || (tok::unicode_class(cp) & (tok::kLetter | tok::kNumber));
  };
  while (i < n) {
    const auto& bucket = by_first_byte[static_cast<uint8_t>(text[i])];
    const AddedToken* hit = nullptr;
    for (size_t k : bucket) {
      const std::string& c = added[k].content;
      if (text.compare(i, c.size(), c) == 0) {
        hit = &added[k];
        break;
      }
    }
    if (hit && hit->single_word) {  // only when not inside a word on either side
      bool left = true;
      if (i > 0) {
        size_t b = i - 1;
        while (b > 0 && is_cont(text[b])) --b;
        left = !word_char(b);
      }
      const size_t e = i + hit->content.size();
      if (!left || !(e == n || !word_char(e))) hit = nullptr;
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + hit->content.size();
    // lstrip / rstrip swallow neighbouring ASCII whitespace (tokenizers: any Unicode whitespace).
    auto ascii_space = [&](size_t at) {
      const auto c = static_cast<uint8_t>(text[at]);
      return c < 0x80 && (tok::unicode_class(c) & tok::kSpace);
    };
    if (hit->lstrip)
      while (start > last && ascii_space(start - 1)) --start;
    if (hit->rstrip)
      while (stop < n && ascii_space(stop)) ++stop;
    if (start > last) out->push_back({last, start, -1});
    out->push_back({start, stop, hit->id});
    last = i = stop;
  }
  if (last < n) out->push_back({last, n, -1});
}

// Applies the normalizer steps to text[begin, end); with `track`, also records each output byte's
// original character range (for offsets).
Normalized Tokenizer::Impl::normalize(std::string_view text, size_t begin, size_t end, bool track) const {
  Normalized n;
  n.s.assign(text.substr(begin, end - begin));
  if (track) {
    n.begin.resize(n.s.size());
    n.end.resize(n.s.size());
    for (size_t i = begin; i < end;) {
      size_t len;
      tok::decode_utf8(text, i, &len);
      for (size_t k = 0; k < len; ++k) {
        n.begin[i - begin + k] = static_cast<uint32_t>(i);
        n.end[i - begin + k] = static_cast<uint32_t>(i + len);
      }
      i += len;
    }
  }
  for (const NormStep& st : norm) {
    if (n.s.empty()) break;
    Normalized o;
    o.s.reserve(n.s.size() + st.a.size());
    if (st.kind == NormKind::kNfc) {
      if (unicode::is_nfc_quick(n.s)) continue;
      thread_local std::vector<unicode::NfcSpan> spans;
      spans.clear();
      unicode::nfc(n.s, &o.s, track ? &spans : nullptr);
      // As tokenizers' transform: a character standing for input takes the alignment of the first
      // input byte it replaces; an inserted one, that of the input byte just before it.
      size_t src = 0;  // the next input byte to be replaced
      for (const unicode::NfcSpan& sp : spans) {
        uint32_t b = static_cast<uint32_t>(begin), e = b;  // inserted before any input: empty
        if (sp.src_bytes > 0 || src > 0) {
          const size_t at = sp.src_bytes > 0 ? src : src - 1;
          b = n.begin[at], e = n.end[at];
        }
        o.begin.insert(o.begin.end(), sp.bytes, b);
        o.end.insert(o.end.end(), sp.bytes, e);
        src += sp.src_bytes;
      }
    } else if (st.kind == NormKind::kPrepend) {
      prepend(n, st.a, track, &o);
    } else if (st.kind == NormKind::kReplace) {
      replace_all(n, st.a, st.b, track, &o);
    } else {  // Metaspace
      replace_all(n, " ", st.a, track, &o);
      if ((st.prepend == 1 || (st.prepend == 2 && begin == 0)) && !o.s.starts_with(st.a)) {
        Normalized p;
        prepend(o, st.a, track, &p);
        o = std::move(p);
      }
    }
    n = std::move(o);
  }
  return n;
}

void Tokenizer::Impl::encode_text(std::string_view text, size_t begin, size_t end, std::vector<int32_t>* ids,
                                  std::vector<std::pair<size_t, size_t>>* offsets) const {
  std::optional<Normalized> normed;
  std::string_view input = text.substr(begin, end - begin);
  const bool nfc_only = std::all_of(norm.begin(), norm.end(), [](const NormStep& s) { return s.kind == NormKind::kNfc; });
  if (!norm.empty() && !(nfc_only && unicode::is_nfc_quick(input))) {
    normed = normalize(text, begin, end, offsets != nullptr);
    input = normed->s;
  }
  thread_local std::vector<std::pair<uint32_t, uint32_t>> pieces;
  pieces.clear();
  if (split && digits) {
    split_digits(input, *split, digits == 1, &pieces);
  } else if (split) {
    tok::split_pattern(input, *split, &pieces);
  } else if (!metaspace_split.empty()) {  // before each replacement character (MergedWithNext)
    size_t start = 0;
    for (size_t i = 1; i < input.size(); ++i) {
      if (input.compare(i, metaspace_split.size(), metaspace_split) != 0) continue;
      pieces.emplace_back(static_cast<uint32_t>(start), static_cast<uint32_t>(i));
      start = i;
    }
    if (start < input.size()) pieces.emplace_back(static_cast<uint32_t>(start), static_cast<uint32_t>(input.size()));
  } else if (metaspace_words) {
    size_t start = 0;
    for (size_t i = 1; i < input.size(); ++i) {
      const size_t m = kMetaspace.size();
      const bool after_metaspace = i >= m && input.compare(i - m, m, kMetaspace) == 0;
      if (!after_metaspace && input.compare(i, m, kMetaspace) == 0) {
        pieces.emplace_back(static_cast<uint32_t>(start), static_cast<uint32_t>(i));
        start = i;
      }
    }
    if (start < input.size()) pieces.emplace_back(static_cast<uint32_t>(start), static_cast<uint32_t>(input.size()));
  } else if (!input.empty()) {
    pieces.emplace_back(0, static_cast<uint32_t>(input.size()));
  }
  std::vector<std::pair<uint32_t, uint32_t>> spans;
  for (const auto& [pb, pe] : pieces) {
    const size_t before = ids->size();
    spans.clear();
    bpe.encode_piece(input.substr(pb, pe - pb), ids, offsets ? &spans : nullptr);
    if (!offsets) continue;
    for (size_t k = 0; k < ids->size() - before; ++k) {
      const size_t sb = pb + spans[k].first, se = pb + spans[k].second;
      if (normed) {
        offsets->emplace_back(normed->begin[sb], normed->end[se - 1]);
      } else {  // widen to whole characters, as tokenizers' alignments do
        size_t b = begin + sb, e = begin + se;
        while (b > begin && is_cont(text[b])) --b;
        while (e < end && is_cont(text[e])) ++e;
        offsets->emplace_back(b, e);
      }
    }
  }
}

std::vector<int32_t> Tokenizer::encode_with_offsets(std::string_view text, bool add_special_tokens,
                                                     std::vector<std::pair<size_t, size_t>>* offsets) const {
  const Impl& im = *impl_;
  std::vector<int32_t> ids;
  if (offsets) offsets->clear();
  std::vector<Impl::Segment> segs;
  if (im.added.empty()) {
    segs.push_back({0, text.size(), -1});
  } else {
    im.split_added(text, &segs);
  }
  for (const auto& s : segs) {
    if (s.added_id >= 0) {
      ids.push_back(s.added_id);
      if (offsets) offsets->emplace_back(s.begin, s.end);
    } else {
      im.encode_text(text, s.begin, s.end, &ids, offsets);
    }
  }
  if (!add_special_tokens || !im.has_template) return ids;
  std::vector<int32_t> out;
  std::vector<std::pair<size_t, size_t>> out_offsets;
  for (const auto& item : im.single) {
    if (!item) {
      out.insert(out.end(), ids.begin(), ids.end());
      if (offsets) out_offsets.insert(out_offsets.end(), offsets->begin(), offsets->end());
    } else {
      out.insert(out.end(), item->begin(), item->end());
      if (offsets) out_offsets.insert(out_offsets.end(), item->size(), {0, 0});
    }
  }
  if (offsets) *offsets = std::move(out_offsets);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return encode_with_offsets(text, add_special_tokens, nullptr);
}

// ---- Decoding ----

std::string Tokenizer::Impl::decode(const std::vector<std::string>& tokens_in) const {
  if (!has_decoder) {
    std::string out;
    for (size_t i = 0; i < tokens_in.size(); ++i) out += (i ? " " : "") + tokens_in[i];
    return out;
  }
  std::vector<std::string> toks = tokens_in;
  for (const DecStep& d : dec) {
    std::vector<std::string> next;
    switch (d.kind) {
      case DecKind::kByteLevel: {
        std::string bytes;
        for (const auto& t : toks) {
          std::string mapped;
          bool ok = true;
          for (size_t i = 0; i < t.size() && ok;) {
            size_t len;
            const int b = tok::unicode_to_byte(tok::decode_utf8(t, i, &len));
            ok = b >= 0;
            mapped.push_back(static_cast<char>(b));
            i += len;
          }
          bytes += ok ? mapped : t;
        }
        next.push_back(tok::utf8_lossy(bytes));
        break;
      }
      case DecKind::kReplace:
        for (auto t : toks) {
          std::string r;
          for (size_t i = 0; i < t.size();) {
            if (!d.a.empty() && t.compare(i, d.a.size(), d.a) == 0) {
              r += d.b;
              i += d.a.size();
            } else {
              r.push_back(t[i++]);
            }
          }
          next.push_back(std::move(r));
        }
        break;
      case DecKind::kByteFallback: {
        std::string pending;
        auto flush = [&] {
          if (pending.empty()) return;
          if (tok::utf8_lossy(pending) == pending) {
            next.push_back(pending);
          } else {
            for (size_t k = 0; k < pending.size(); ++k) next.push_back("\xEF\xBF\xBD");
          }
          pending.clear();
        };
        for (const auto& t : toks) {
          int v = -1;
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
            auto hex = [](char c) {
              return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            };
            const int h = hex(t[3]), l = hex(t[4]);
            if (h >= 0 && l >= 0) v = h * 16 + l;
          }
          if (v >= 0) {
            pending.push_back(static_cast<char>(v));
          } else {
            flush();
            next.push_back(t);
          }
        }
        flush();
        break;
      }
      case DecKind::kFuse: {
        std::string all;
        for (const auto& t : toks) all += t;
        next.push_back(std::move(all));
        break;
      }
      case DecKind::kStrip:
        for (const auto& t : toks) {
          size_t b = 0, e = t.size();
          for (int k = 0; k < d.start && t.compare(b, d.b.size(), d.b) == 0 && b < e; ++k) b += d.b.size();
          for (int k = 0; k < d.stop && e - b >= d.b.size() && t.compare(e - d.b.size(), d.b.size(), d.b) == 0; ++k)
            e -= d.b.size();
          next.push_back(t.substr(b, e - b));
        }
        break;
    }
    toks = std::move(next);
  }
  std::string out;
  for (const auto& t : toks) out += t;
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (auto it = im.added_by_id.find(id); it != im.added_by_id.end()) {
      const AddedToken& a = im.added[it->second];
      if (!(skip_special_tokens && a.special)) tokens.push_back(a.content);
    } else if (id >= 0 && static_cast<size_t>(id) < im.bpe.id_to_token().size() &&
               !im.bpe.id_to_token()[id].empty()) {
      tokens.push_back(im.bpe.id_to_token()[id]);
    }  // unknown ids are skipped, as in tokenizers
  }
  return im.decode(tokens);
}

// ---- Vocabulary queries ----

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(tok::key(token)); it != impl_->added_by_content.end()) return it->second;
  if (auto it = impl_->bpe.vocab().find(tok::key(token)); it != impl_->bpe.vocab().end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) return impl_->added[it->second].content;
  const auto& v = impl_->bpe.id_to_token();
  return id >= 0 && static_cast<size_t>(id) < v.size() ? v[id] : std::string();
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

absl::Status Tokenizer::fits_vocab(int64_t model_vocab_size) const {
  if (vocab_size() <= model_vocab_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("the tokenizer has ", vocab_size(), " tokens but the model's vocab_size is ",
                                                 model_vocab_size, ": token ids would be out of range"));
}
Tokenizer::Kind Tokenizer::kind() const { return impl_->kind; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

}  // namespace loom
