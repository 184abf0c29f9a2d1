// Tokenizer: loads tokenizer.json and runs the `tokenizers` pipeline — added-token split,
// normalizers, pre-tokenizer, BPE model, post-processor — and the decoder chain.
#include "text/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "text/gguf_tokenizer.h"
#include "text/tokenizer_internal.h"
#include "text/unicode_nfc.h"

namespace loom {

using json = nlohmann::json;

namespace {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

// Normalizer steps. NFC (text/unicode_nfc.h) is skipped when the quick check says the text is NFC.
// kMetaspace is the Metaspace pre-tokenizer's rewriting of its piece: " " -> a, then a prepended
// unless the piece starts with it (prepend: 0 never, 1 always, 2 only the piece at offset 0).
enum class NormKind { kPrepend, kReplace, kNfc, kMetaspace };
struct NormStep {
  NormKind kind;
  std::string a, b;  // prepend text; or pattern -> content; Metaspace: the replacement
  int prepend = 0;
};

enum class DecKind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip };
struct DecStep {
  DecKind kind;
  std::string a, b;  // Replace: pattern -> content; Strip: content
  int start = 0, stop = 0;
};

// A normalized string with, for each of its bytes, the original byte range of the character it
// came from.
struct Normalized {
  std::string s;
  std::vector<uint32_t> begin, end;
};

absl::Status bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

std::string type_of(const json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "?"; }

// Replace's pattern: {"String": s}; a {"Regex": ...} pattern is not supported.
absl::StatusOr<std::string> string_pattern(const json& j, const std::string& path, const std::string& where) {
  auto p = j.find("pattern");
  if (p != j.end() && p->is_object() && p->contains("String") && (*p)["String"].is_string())
    return (*p)["String"].get<std::string>();
  return bad(path, absl::StrCat(where, ": only {\"String\": ...} patterns are supported"));
}

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 "▁"

// The Metaspace pre-tokenizer {replacement, prepend_scheme always|first|never (older files:
// add_prefix_space), split} as a normalizer step; tokenizers' defaults when a field is absent.
absl::StatusOr<NormStep> parse_metaspace(const json& j, const std::string& path, const std::string& where) {
  NormStep st{NormKind::kMetaspace, std::string(kMetaspace), "", 1};
  if (j.contains("replacement")) {
    if (!j["replacement"].is_string() || j["replacement"].get<std::string>().empty())
      return bad(path, absl::StrCat(where, ": replacement must be a one-character string"));
    st.a = j["replacement"].get<std::string>();
    size_t len;
    tok::decode_utf8(st.a, 0, &len);
    if (len != st.a.size()) return bad(path, absl::StrCat(where, ": replacement must be a one-character string"));
  }
  if (j.contains("prepend_scheme")) {
    const std::string scheme = j["prepend_scheme"].is_string() ? j["prepend_scheme"].get<std::string>() : "";
    if (scheme == "never") st.prepend = 0;
    else if (scheme == "always") st.prepend = 1;
    else if (scheme == "first") st.prepend = 2;
    else return bad(path, absl::StrCat(where, ": prepend_scheme '", scheme, "' (expected always, first or never)"));
  } else if (j.contains("add_prefix_space")) {
    st.prepend = j["add_prefix_space"].get<bool>() ? 1 : 0;
  }
  return st;
}

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

struct Tokenizer::Impl {
  std::string path;
  Kind kind = Kind::kByteLevelBpe;
  tok::Bpe bpe;
  std::vector<AddedToken> added;
  absl::flat_hash_map<std::string, int32_t> added_by_content;
  absl::flat_hash_map<int32_t, size_t> added_by_id;
  std::vector<size_t> by_first_byte[256];  // added-token indices, longest first
  std::vector<NormStep> norm;
  std::optional<tok::SplitPattern> split;
  bool byte_level = false;
  int digits = 0;  // a Digits pre-tokenizer step: 0 none, 1 individual digits, 2 runs of digits
  // SentencePiece-style BPE whose vocab has "▁" only at the start of tokens: no token can span a
  // boundary between a non-"▁" character and a "▁", so the text is cut there into words that BPE
  // (and its cache) handles one at a time, with the same result as merging the whole text.
  bool metaspace_words = false;
  // A Metaspace pre-tokenizer with split=true: each piece starts at a replacement character.
  std::string metaspace_split;
  bool has_decoder = false;
  std::vector<DecStep> dec;
  bool has_template = false;
  std::vector<std::optional<std::vector<int32_t>>> single;  // nullopt = the sequence
  std::optional<int32_t> bos, eos;
  int64_t vocab_size = 0;

  absl::Status parse_added(const json& j);
  absl::Status parse_normalizer(const json& j, const std::string& where);
  absl::Status parse_pre_tokenizer(const json& j);
  absl::Status parse_decoder(const json& j, const std::string& where);
  absl::Status parse_post_processor(const json& j, const std::string& where);

  struct Segment {
    size_t begin, end;
    int32_t added_id;  // -1: text
  };
  void split_added(std::string_view text, std::vector<Segment>* out) const;
  void encode_text(std::string_view text, size_t begin, size_t end, std::vector<int32_t>* ids,
                   std::vector<std::pair<size_t, size_t>>* offsets) const;
  Normalized normalize(std::string_view text, size_t begin, size_t end, bool track) const;
  std::string decode(const std::vector<std::string>& tokens) const;
};

// ---- Loading ----

absl::Status Tokenizer::Impl::parse_added(const json& j) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_array()) return bad(path, "added_tokens: expected an array");
  for (const auto& t : j) {
    if (!t.is_object() || !t.contains("content") || !t.contains("id") || !t["content"].is_string() ||
        !t["id"].is_number_integer())
      return bad(path, "added_tokens: each entry needs \"content\" and \"id\"");
    AddedToken a;
    a.content = t["content"].get<std::string>();
    a.id = t["id"].get<int32_t>();
    a.special = t.value("special", false);
    a.single_word = t.value("single_word", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.normalized = t.value("normalized", !a.special);
    if (a.content.empty()) return bad(path, "added_tokens: empty content");
    added_by_content[a.content] = a.id;
    added_by_id[a.id] = added.size();
    added.push_back(std::move(a));
  }
  for (size_t i = 0; i < added.size(); ++i) by_first_byte[static_cast<uint8_t>(added[i].content[0])].push_back(i);
  for (auto& v : by_first_byte)
    std::stable_sort(v.begin(), v.end(), [&](size_t x, size_t y) { return added[x].content.size() > added[y].content.size(); });
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::parse_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return absl::OkStatus();
  const std::string t = type_of(j);
  if (t == "Sequence") {
    const auto& list = j.contains("normalizers") ? j["normalizers"] : json::array();
    for (size_t i = 0; i < list.size(); ++i)
      if (auto s = parse_normalizer(list[i], absl::StrCat(where, ".normalizers[", i, "]")); !s.ok()) return s;
    return absl::OkStatus();
  }
  if (t == "NFC") {
    norm.push_back({NormKind::kNfc, "", ""});
    return absl::OkStatus();
  }
  if (t == "Prepend" && j.contains("prepend") && j["prepend"].is_string()) {
    norm.push_back({NormKind::kPrepend, j["prepend"].get<std::string>(), ""});
    return absl::OkStatus();
  }
  if (t == "Replace") {
    auto p = string_pattern(j, path, where);
    if (!p.ok()) return p.status();
    if (p->empty()) return bad(path, absl::StrCat(where, ": empty Replace pattern"));
    norm.push_back({NormKind::kReplace, *p, j.value("content", std::string())});
    return absl::OkStatus();
  }
  return bad(path, absl::StrCat(where, ": unsupported normalizer '", t, "'"));
}

absl::Status Tokenizer::Impl::parse_pre_tokenizer(const json& j) {
  if (j.is_null()) return absl::OkStatus();
  std::vector<json> steps;
  if (type_of(j) == "Sequence") {
    for (const auto& s : j.value("pretokenizers", json::array())) steps.push_back(s);
  } else {
    steps.push_back(j);
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& s = steps[i];
    const std::string t = type_of(s);
    const std::string where = absl::StrCat("pre_tokenizer step ", i, " (", t, ")");
    const bool spaces_replaced = std::any_of(norm.begin(), norm.end(), [](const NormStep& n) {
      return n.kind == NormKind::kReplace && n.a == " " && n.b.find(' ') == std::string::npos;
    });
    if (t == "Split" && s.contains("pattern") && s["pattern"].is_object() && s["pattern"].value("String", "") == " " &&
        spaces_replaced) {
      continue;  // (Gemma 3) splitting on " " after the normalizer replaced every " " is a no-op
    }
    if (t == "Metaspace" && steps.size() == 1) {
      auto st = parse_metaspace(s, path, where);
      if (!st.ok()) return st.status();
      norm.push_back(*st);
      if (s.value("split", true)) metaspace_split = st->a;
      continue;
    }
    if (t == "Split" && !split && !byte_level) {
      auto p = s.find("pattern");
      std::string regex;
      if (p != s.end() && p->is_object() && p->contains("Regex") && (*p)["Regex"].is_string())
        regex = (*p)["Regex"].get<std::string>();
      tok::SplitPattern sp;
      if (!tok::parse_split_pattern(regex, &sp))
        return bad(path, absl::StrCat(where, ": unsupported regex '", regex, "' (Llama 3, Qwen2 and GPT-2 patterns are)"));
      if (s.value("behavior", std::string()) != "Isolated" || s.value("invert", false))
        return bad(path, absl::StrCat(where, ": only behavior Isolated without invert is supported"));
      split = sp;
    } else if (t == "Digits" && !split && !byte_level && digits == 0) {
      digits = s.value("individual_digits", false) ? 1 : 2;  // (SmolLM2, StarCoder)
    } else if (t == "ByteLevel" && !byte_level) {
      if (s.value("add_prefix_space", false))
        return bad(path, absl::StrCat(where, ": add_prefix_space=true is not supported"));
      if (s.value("use_regex", true)) {
        if (split) return bad(path, absl::StrCat(where, ": use_regex=true after a Split is not supported"));
        split = tok::SplitPattern::kGpt2;
      }
      byte_level = true;
    } else {
      return bad(path, absl::StrCat(where, ": unsupported pre-tokenizer"));
    }
  }
  if ((split || digits) && !byte_level)
    return bad(path, "pre_tokenizer: a Split or Digits step without ByteLevel is not supported");
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::parse_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return absl::OkStatus();
  has_decoder = true;
  const std::string t = type_of(j);
  if (t == "Sequence") {
    const auto& list = j.contains("decoders") ? j["decoders"] : json::array();
    for (size_t i = 0; i < list.size(); ++i)
      if (auto s = parse_decoder(list[i], absl::StrCat(where, ".decoders[", i, "]")); !s.ok()) return s;
  } else if (t == "ByteLevel") {
    dec.push_back({DecKind::kByteLevel, "", "", 0, 0});
  } else if (t == "Replace") {
    auto p = string_pattern(j, path, where);
    if (!p.ok()) return p.status();
    dec.push_back({DecKind::kReplace, *p, j.value("content", std::string()), 0, 0});
  } else if (t == "ByteFallback") {
    dec.push_back({DecKind::kByteFallback, "", "", 0, 0});
  } else if (t == "Fuse") {
    dec.push_back({DecKind::kFuse, "", "", 0, 0});
  } else if (t == "Strip") {
    dec.push_back({DecKind::kStrip, "", j.value("content", std::string(" ")), j.value("start", 0), j.value("stop", 0)});
  } else {
    return bad(path, absl::StrCat(where, ": unsupported decoder '", t, "'"));
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::parse_post_processor(const json& j, const std::string& where) {
  if (j.is_null()) return absl::OkStatus();
  const std::string t = type_of(j);
  if (t == "Sequence") {
    const auto& list = j.contains("processors") ? j["processors"] : json::array();
    for (size_t i = 0; i < list.size(); ++i)
      if (auto s = parse_post_processor(list[i], absl::StrCat(where, ".processors[", i, "]")); !s.ok()) return s;
    return absl::OkStatus();
  }
  if (t == "ByteLevel") return absl::OkStatus();  // changes offsets only (trim_offsets), never ids
  if (t != "TemplateProcessing" || has_template)
    return bad(path, absl::StrCat(where, ": unsupported post-processor '", t, "'"));
  has_template = true;
  const json specials = j.value("special_tokens", json::object());
  for (const auto& item : j.value("single", json::array())) {
    if (item.contains("Sequence")) {
      single.push_back(std::nullopt);
    } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id")) {
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (!specials.contains(name) || !specials[name].contains("ids"))
        return bad(path, absl::StrCat(where, ": special token '", name, "' missing from special_tokens"));
      single.push_back(specials[name]["ids"].get<std::vector<int32_t>>());
    } else {
      return bad(path, absl::StrCat(where, ": unrecognised template item ", item.dump()));
    }
  }
  bool seen_sequence = false;
  for (const auto& item : single) {
    if (!item) seen_sequence = true;
    else if (!item->empty() && !seen_sequence && !bos) bos = item->front();
    else if (!item->empty() && seen_sequence && !eos) eos = item->front();
  }
  return absl::OkStatus();
}

absl::StatusOr<Tokenizer> Tokenizer::load(const std::string& path_in) {
  std::string path = path_in;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    path += "/tokenizer.json";
    if (!std::filesystem::exists(path, ec))
      return absl::NotFoundError(absl::StrCat(path_in, ": no tokenizer.json in this folder (a Hugging Face model ",
                                              "folder ships one next to config.json)"));
  }
  json j;
  if (path.size() > 5 && path.ends_with(".gguf")) {  // a llama.cpp file: its tokenizer.ggml.* metadata
    auto gguf = GgufFile::open(path);
    if (!gguf.ok()) return gguf.status();
    auto files = gguf_hf_tokenizer(*gguf);
    if (!files.ok()) return files.status();
    j = std::move(files->tokenizer_json);
  } else {
    std::ifstream f(path, std::ios::binary);
    if (!f.good()) return absl::NotFoundError(absl::StrCat(path, ": cannot open tokenizer file: ", std::strerror(errno)));
    try {
      j = json::parse(f);
    } catch (const json::exception& e) {
      return bad(path, absl::StrCat("malformed JSON: ", e.what()));
    } catch (const std::exception& e) {  // ios_base::failure: a read error, or a folder without tokenizer.json
      return bad(path, absl::StrCat("cannot read: ", e.what()));
    }
  }
  Tokenizer tk;
  Impl& im = *tk.impl_;
  im.path = path;
  try {
    if (!j.is_object() || !j.contains("model")) return bad(path, "no \"model\" object");
    const std::string model_type = type_of(j["model"]);
    // Files written by old tokenizers versions omit the BPE model's type.
    if (model_type != "BPE" && !(model_type == "?" && j["model"].contains("merges")))
      return bad(path, absl::StrCat("unsupported model type '", model_type, "' (only BPE is supported)"));
    if (auto s = im.parse_added(j.value("added_tokens", json())); !s.ok()) return s;
    if (auto s = im.parse_normalizer(j.value("normalizer", json()), "normalizer"); !s.ok()) return s;
    if (auto s = im.parse_pre_tokenizer(j.value("pre_tokenizer", json())); !s.ok()) return s;
    if (auto s = im.parse_decoder(j.value("decoder", json()), "decoder"); !s.ok()) return s;
    if (auto s = im.parse_post_processor(j.value("post_processor", json()), "post_processor"); !s.ok()) return s;
    if (auto s = im.bpe.load(j["model"], path, im.byte_level); !s.ok()) return s;
  } catch (const json::exception& e) {  // a field of the wrong JSON type
    return bad(path, absl::StrCat("unexpected JSON structure: ", e.what()));
  }
  im.kind = im.byte_level ? Kind::kByteLevelBpe : Kind::kSentencePieceBpe;
  if (!im.byte_level && im.bpe.vocab().contains(tok::key(kMetaspace))) {
    im.metaspace_words = true;
    for (const auto& [t, id] : im.bpe.vocab()) {
      size_t i = 0;
      while (t.compare(i, kMetaspace.size(), kMetaspace) == 0) i += kMetaspace.size();
      if (t.find(kMetaspace, i) != std::string::npos) {
        im.metaspace_words = false;
        break;
      }
    }
  }
  im.vocab_size = static_cast<int64_t>(im.bpe.id_to_token().size());
  for (const auto& a : im.added) im.vocab_size = std::max<int64_t>(im.vocab_size, a.id + 1);
  // The ids the post-processor inserts (BOS/EOS) must be tokens of this vocabulary (found by fuzzing:
  // a template naming id 1202 in a 1202-token vocabulary made encode() return it).
  for (const auto& item : im.single)
    for (int32_t id : item.value_or(std::vector<int32_t>{}))
      if (id < 0 || id >= im.vocab_size)
        return bad(path, absl::StrCat("post_processor: special token id ", id, " is outside the vocabulary (",
                                      im.vocab_size, " tokens)"));
  if (!im.has_template) {
    for (const char* name : {"<|begin_of_text|>", "<s>", "<bos>"})
      if (auto it = im.added_by_content.find(name); it != im.added_by_content.end() && !im.bos) im.bos = it->second;
  }
  for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"})
    if (auto it = im.added_by_content.find(name); it != im.added_by_content.end() && !im.eos) im.eos = it->second;
  return tk;
}

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
