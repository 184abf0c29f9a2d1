// The BPE model of tokenizer.json: vocabulary, merge ranks, and the per-piece merge loop of
// `tokenizers` (lowest rank first, leftmost first on ties) with ignore_merges, byte fallback,
// fused unknowns and a cache of repeated pieces.
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "text/tokenizer_internal.h"

namespace loom::tok {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxCachedPieceBytes = 256;  // as tokenizers' MAX_LENGTH
constexpr size_t kMaxCacheEntries = 1 << 18;

absl::Status bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

bool null_or_empty(const json& m, const char* key) {
  auto it = m.find(key);
  return it == m.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
}

}  // namespace

absl::Status Bpe::load(const json& m, const std::string& path, bool byte_level) {
  byte_level_ = byte_level;
  if (!null_or_empty(m, "continuing_subword_prefix") || !null_or_empty(m, "end_of_word_suffix"))
    return bad(path, "model: BPE continuing_subword_prefix / end_of_word_suffix are not supported");
  if (auto it = m.find("dropout"); it != m.end() && !it->is_null() && it->get<double>() != 0.0)
    return bad(path, "model: BPE dropout is not supported");
  ignore_merges_ = m.value("ignore_merges", false);
  byte_fallback_ = m.value("byte_fallback", false);
  fuse_unk_ = m.value("fuse_unk", false);

  auto vit = m.find("vocab");
  if (vit == m.end() || !vit->is_object()) return bad(path, "model.vocab: expected an object of token -> id");
  int32_t max_id = -1;
  vocab_.reserve(vit->size());
  for (auto it = vit->begin(); it != vit->end(); ++it) {
    if (!it.value().is_number_integer()) return bad(path, absl::StrCat("model.vocab[", it.key(), "]: expected an id"));
    const std::optional<int32_t> parsed = json_token_id(it.value());
    if (!parsed) return bad(path, absl::StrCat("model.vocab[", it.key(), "]: id ", it.value().dump(), " is outside [0, 2^31)"));
    const int32_t id = *parsed;
    vocab_[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(max_id + 1, std::string());
  for (const auto& [tok, id] : vocab_) id_to_token_[id] = tok;

  if (auto it = m.find("unk_token"); it != m.end() && it->is_string()) {
    auto u = vocab_.find(it->get<std::string>());
    if (u == vocab_.end()) return bad(path, absl::StrCat("model.unk_token '", it->get<std::string>(), "' is not in the vocab"));
    unk_id_ = u->second;
  }

  auto mit = m.find("merges");
  if (mit != m.end() && !mit->is_array()) return bad(path, "model.merges: expected an array");
  if (mit != m.end()) {
    merges_.reserve(mit->size());
    int32_t rank = 0;
    for (const auto& e : *mit) {
      std::string a, b;
      if (e.is_string()) {  // "a b"
        const auto s = e.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          return bad(path, absl::StrCat("model.merges[", rank, "]: '", s, "' is not two tokens"));
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // ["a", "b"]
        a = e[0].get<std::string>(), b = e[1].get<std::string>();
      } else {
        return bad(path, absl::StrCat("model.merges[", rank, "]: expected \"a b\" or [\"a\", \"b\"]"));
      }
      auto ia = vocab_.find(a), ib = vocab_.find(b), inew = vocab_.find(a + b);
      if (ia == vocab_.end() || ib == vocab_.end() || inew == vocab_.end())
        return bad(path, absl::StrCat("model.merges[", rank, "]: '", a, "' + '", b, "' is not in the vocab"));
      const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
      merges_[key] = {rank, inew->second};  // a repeated pair keeps its last rank, as tokenizers does
      ++rank;
    }
  }

  for (int b = 0; b < 256; ++b) {
    auto f = vocab_.find(absl::StrFormat("<0x%02X>", b));
    fallback_id_[b] = f == vocab_.end() ? -1 : f->second;
    byte_id_[b] = -1;
  }
  if (byte_level_) {
    for (int b = 0; b < 256; ++b) {
      std::string s;
      append_utf8(&s, byte_to_unicode(static_cast<uint8_t>(b)));
      auto f = vocab_.find(s);
      byte_id_[b] = f == vocab_.end() ? -1 : f->second;
    }
    // Raw-byte spelling of every token made only of byte-level characters (for ignore_merges).
    raw_vocab_.reserve(vocab_.size());
    for (const auto& [tok, id] : vocab_) {
      std::string raw;
      bool ok = true;
      for (size_t i = 0; i < tok.size() && ok;) {
        size_t len;
        const int byte = unicode_to_byte(decode_utf8(tok, i, &len));
        ok = byte >= 0;
        raw.push_back(static_cast<char>(byte));
        i += len;
      }
      if (ok) raw_vocab_[raw] = id;
    }
  }
  return absl::OkStatus();
}

// tokenizers' BPE::merge_word before merging: one symbol per character (per byte for byte-level),
// unknown characters as <0xNN> byte tokens (byte_fallback) or the unknown token (fused when
// fuse_unk); without an unknown token they are dropped.
void Bpe::initial_symbols(std::string_view piece, std::vector<Symbol>* syms) const {
  syms->clear();
  bool have_unk = false;
  Symbol unk{};
  auto flush_unk = [&] {
    if (have_unk) syms->push_back(unk);
    have_unk = false;
  };
  for (size_t i = 0; i < piece.size();) {
    size_t len;
    int32_t id = -1;
    if (byte_level_) {
      len = 1;
      id = byte_id_[static_cast<uint8_t>(piece[i])];
    } else {
      decode_utf8(piece, i, &len);
      auto f = vocab_.find(key(piece.substr(i, len)));
      if (f != vocab_.end()) id = f->second;
    }
    const auto begin = static_cast<uint32_t>(i), end = static_cast<uint32_t>(i + len);
    i += len;
    if (id >= 0) {
      flush_unk();
      syms->push_back({id, begin, end});
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (uint32_t k = begin; k < end; ++k) all = all && fallback_id_[static_cast<uint8_t>(piece[k])] >= 0;
      if (all) {  // note: like tokenizers, a pending unknown is not flushed before these
        for (uint32_t k = begin; k < end; ++k) syms->push_back({fallback_id_[static_cast<uint8_t>(piece[k])], k, k + 1});
        continue;
      }
    }
    if (!unk_id_) continue;
    if (have_unk && fuse_unk_) {
      unk.end = end;
    } else {
      flush_unk();
      unk = {*unk_id_, begin, end};
      have_unk = true;
    }
  }
  flush_unk();
}

// tokenizers' Word::merge_all without dropout.
void Bpe::merge(std::vector<Symbol>* syms) const {
  const int n = static_cast<int>(syms->size());
  if (n < 2 || merges_.empty()) return;
  struct Node {
    int prev, next;
    bool alive;
  };
  std::vector<Node> nodes(n);
  for (int i = 0; i < n; ++i) nodes[i] = {i - 1, i + 1 < n ? i + 1 : -1, true};
  struct Cand {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  auto& s = *syms;
  auto find = [&](int32_t a, int32_t b) -> const std::pair<int32_t, int32_t>* {
    auto it = merges_.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::vector<Cand> heap;
  heap.reserve(n);
  for (int i = 0; i + 1 < n; ++i)
    if (auto m = find(s[i].id, s[i + 1].id)) heap.push_back({m->first, i, m->second});
  auto cmp = std::greater<Cand>();
  std::make_heap(heap.begin(), heap.end(), cmp);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const Cand top = heap.back();
    heap.pop_back();
    Node& cur = nodes[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    const int right = cur.next;
    auto m = find(s[top.pos].id, s[right].id);
    if (!m || m->second != top.new_id) continue;  // stale entry
    s[top.pos].id = top.new_id;
    s[top.pos].end = s[right].end;
    nodes[right].alive = false;
    cur.next = nodes[right].next;
    if (cur.next >= 0) nodes[cur.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (auto pm = find(s[cur.prev].id, s[top.pos].id)) {
        heap.push_back({pm->first, cur.prev, pm->second});
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
    }
    if (cur.next >= 0) {
      if (auto nm = find(s[top.pos].id, s[cur.next].id)) {
        heap.push_back({nm->first, top.pos, nm->second});
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
    }
  }
  int w = 0;
  for (int i = 0; i < n; ++i)
    if (nodes[i].alive) s[w++] = s[i];
  s.resize(w);
}

void Bpe::encode_piece(std::string_view piece, std::vector<int32_t>* ids,
                       std::vector<std::pair<uint32_t, uint32_t>>* spans) const {
  if (piece.empty()) return;
  auto emit = [&](const std::vector<Symbol>& syms) {
    for (const Symbol& s : syms) ids->push_back(s.id);
    if (spans)
      for (const Symbol& s : syms) spans->emplace_back(s.begin, s.end);
  };
  const bool cacheable = piece.size() < kMaxCachedPieceBytes;
  if (cacheable) {
    absl::ReaderMutexLock lock(&cache_mu_);
    if (auto f = cache_.find(key(piece)); f != cache_.end()) {
      emit(f->second);
      return;
    }
  }
  if (ignore_merges_) {  // after the cache: a hit answers both cases
    const auto& whole = byte_level_ ? raw_vocab_ : vocab_;
    if (auto f = whole.find(key(piece)); f != whole.end()) {
      const std::vector<Symbol> whole_token = {{f->second, 0, static_cast<uint32_t>(piece.size())}};
      emit(whole_token);
      if (cacheable) {
        absl::MutexLock lock(&cache_mu_);
        if (cache_.size() < kMaxCacheEntries) cache_.emplace(std::string(piece), whole_token);
      }
      return;
    }
  }
  std::vector<Symbol> syms;
  initial_symbols(piece, &syms);
  merge(&syms);
  emit(syms);
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() < kMaxCacheEntries) cache_.emplace(std::string(piece), std::move(syms));
  }
}

}  // namespace loom::tok
