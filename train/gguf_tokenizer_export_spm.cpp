// Hugging Face SentencePiece-style tokenizers (Llama 2, Mistral, Gemma, Phi-3) -> llama.cpp's "llama"
// vocabulary: tokens, scores and token types as convert_hf_to_gguf.py writes them from tokenizer.model,
// or, from tokenizer.json alone, the same arrays recovered from what transformers made of that model.
//
// llama.cpp's SentencePiece tokenizer escapes spaces as "▁" (after one prefix space unless
// add_space_prefix is false), then repeatedly merges the adjacent pair whose concatenation is the
// highest-scoring token (leftmost first on ties). tokenizer.json's BPE merges by rank instead, so
// from tokenizer.json the scores must rank every merge product as its merges do; gguf-py's
// LlamaHfVocab writes a placeholder -1000 for every token, which makes llama.cpp merge leftmost first.
#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <regex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/json_file.h"
#include "engine/status_macros.h"
#include "text/sentencepiece_model.h"
#include "train/gguf_tokenizer_export_internal.h"

namespace loom::gguf_export {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;
constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 "▁"

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

// Byte offsets where code points start after the first (the places transformers' generate_merges splits).
std::vector<size_t> inner_char_starts(const std::string& s) {
  std::vector<size_t> out;
  for (size_t i = 1; i < s.size(); ++i)
    if ((static_cast<uint8_t>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  return out;
}

bool is_byte_token(const std::string& t) {  // "<0xNN>", as LlamaHfVocab and SentencePiece spell bytes
  static const std::regex re("<0x[0-9A-Fa-f]{2}>");
  return t.size() == 6 && std::regex_match(t, re);
}

// TextModel.does_token_look_special: added tokens some models do not mark special but are.
bool looks_special(const std::string& t) {
  if (t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]") return true;
  if (t.starts_with("<|") && t.ends_with("|>")) return true;
  if (t.starts_with("<\xEF\xBD\x9C") && t.ends_with("\xEF\xBD\x9C>")) return true;  // "<｜...｜>"
  return t.starts_with("<unused") && t.ends_with(">");
}

bool is_replace_space(const json& n) {
  return n.is_object() && n.value("type", "") == "Replace" && n.contains("pattern") && n["pattern"].is_object() &&
         n["pattern"].value("String", "") == " " && n.value("content", "") == kSpace;
}

// Whether llama.cpp's tokenizer, which escapes every space as "▁" and merges across the whole text,
// reproduces tokenizer.json's normalizer and pre-tokenizer, and with a prefix space or without:
// Llama 2 / Phi-3 (Prepend "▁" + Replace " "), Mistral (Metaspace, not split), Gemma (Replace " ",
// then a Split on " " that finds none).
absl::StatusOr<bool> json_space_prefix(const json& tj, const std::string& where) {
  const json norm = tj.value("normalizer", json()), pre = tj.value("pre_tokenizer", json());
  auto refuse = [&](const std::string& what) {
    return absl::UnimplementedError(absl::StrCat(
        where, ": ", what, " (normalizer ", norm.dump().substr(0, 200), ", pre_tokenizer ", pre.dump().substr(0, 200),
        "); llama.cpp's SentencePiece tokenizer only escapes spaces as \"\xE2\x96\x81\", with or without one prefix "
        "space, so a GGUF file cannot reproduce this tokenizer"));
  };
  bool escapes = false, prepends = false;
  std::vector<json> steps;
  if (norm.is_object() && norm.value("type", "") == "Sequence" && norm.contains("normalizers"))
    steps.assign(norm["normalizers"].begin(), norm["normalizers"].end());
  else if (!norm.is_null())
    steps.push_back(norm);
  for (const json& s : steps) {
    if (is_replace_space(s) && !escapes) escapes = true;
    else if (s.is_object() && s.value("type", "") == "Prepend" && s.value("prepend", "") == kSpace && !prepends && !escapes)
      prepends = true;
    else
      return refuse(absl::StrCat("normalizer step ", s.dump().substr(0, 200), " is not one llama.cpp applies"));
  }
  if (escapes) {
    const bool noop_split = pre.is_object() && pre.value("type", "") == "Split" && pre.contains("pattern") &&
                            pre["pattern"].is_object() && pre["pattern"].value("String", "") == " " &&
                            pre.value("behavior", "") == "MergedWithPrevious" && !pre.value("invert", false);
    if (!pre.is_null() && !noop_split) return refuse("a pre-tokenizer after the normalizer replaced the spaces");
    return prepends;
  }
  if (prepends) return refuse("a Prepend normalizer without the Replace of spaces");
  if (!pre.is_object() || pre.value("type", "") != "Metaspace")
    return refuse("neither a normalizer that replaces spaces with \"\xE2\x96\x81\" nor a Metaspace pre-tokenizer");
  if (pre.value("replacement", std::string(kSpace)) != kSpace) return refuse("a Metaspace replacement other than \"\xE2\x96\x81\"");
  if (pre.value("split", true)) return refuse("a Metaspace pre-tokenizer that splits the text into words");
  if (pre.contains("prepend_scheme")) return pre.value("prepend_scheme", "always") != "never";
  return pre.value("add_prefix_space", true);
}

// A merge "a b" or ["a", "b"].
absl::StatusOr<std::pair<std::string, std::string>> merge_pair(const json& m, const std::string& where, size_t k) {
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) return std::pair{m[0].get<std::string>(), m[1].get<std::string>()};
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    const size_t sp = s.find(' ');
    if (sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos) return std::pair{s.substr(0, sp), s.substr(sp + 1)};
  }
  return absl::InvalidArgumentError(absl::StrCat(where, ": model.merges[", k, "] is ", m.dump().substr(0, 100), ", expected 'a b' or [a, b]"));
}

// The vocabulary tokenizer.model would have given, read back from tokenizer.json: SentencePiece's
// pieces in id order (transformers' SpmConverter keeps the ids), the unknown piece UNKNOWN, control
// pieces (special added tokens) CONTROL, "<0xNN>" BYTE, everything else NORMAL as llama.cpp reads a
// user-defined piece; scores 0 but for normal pieces, which get -0, -1, -2, ... in the order their
// first merge has in model.merges (tokens no merge makes last, by id). For a tokenizer.json that
// transformers made from a SentencePiece BPE model these are the model's own scores.
absl::Status vocab_from_json(const json& tj, const std::string& where, int64_t vocab_size, SpmVocab& v) {
  const json& model = tj["model"];
  if (model.value("type", "") != "BPE" || !model.contains("vocab") || !model["vocab"].is_object())
    return absl::UnimplementedError(absl::StrCat(
        where, ": model.type is ", model.value("type", "?"), "; llama.cpp's SentencePiece vocabulary merges pieces "
        "pairwise by score, which reproduces a BPE model's merges but not a ", model.value("type", "?"),
        " model's segmentation"));
  absl::flat_hash_map<std::string, int64_t> vocab;
  std::vector<bool> added(vocab_size, false);
  auto place = [&](const std::string& text, const json& id_json, const char* field) -> absl::StatusOr<int64_t> {
    if (!id_json.is_number_integer()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, " '", text, "' has no integer id"));
    const int64_t id = id_json.get<int64_t>();
    if (id < 0 || id >= vocab_size)
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, " '", text, "' has id ", id,
                                                     ", outside the model's vocabulary of ", vocab_size));
    v.tokens[id] = text;
    v.filled[id] = true;
    v.types[id] = kNormal;
    v.scores[id] = 0.0f;
    return id;
  };
  for (const auto& [text, id] : model["vocab"].items()) {
    LOOM_ASSIGN_OR_RETURN(const int64_t i, place(text, id, "model.vocab token"));
    vocab[text] = i;
    if (is_byte_token(text)) v.types[i] = kByte;
  }
  if (model.contains("unk_token") && model["unk_token"].is_string())
    if (auto it = vocab.find(model["unk_token"].get<std::string>()); it != vocab.end()) v.types[it->second] = kUnknown;
  for (const json& a : tj.value("added_tokens", json::array())) {
    if (!a.is_object() || !a.contains("content") || !a["content"].is_string())
      return absl::InvalidArgumentError(absl::StrCat(where, ": an added_tokens entry lacks its content"));
    const std::string text = a["content"].get<std::string>();
    const bool unknown = vocab.contains(text) && v.types[vocab[text]] == kUnknown;
    LOOM_ASSIGN_OR_RETURN(const int64_t i, place(text, a.value("id", json()), "added token"));
    added[i] = true;
    v.types[i] = unknown ? kUnknown : a.value("special", false) ? kControl : kNormal;
  }

  // Merge products in rank order; each product's merges must be one run (a score ranks a product,
  // not a merge), and a token that two vocabulary tokens make must have a merge (llama.cpp would
  // make it where BPE never does).
  absl::flat_hash_map<std::string, size_t> first_rank, last_rank;
  const json merges = model.value("merges", json::array());
  for (size_t k = 0; k < merges.size(); ++k) {
    LOOM_ASSIGN_OR_RETURN(const auto lr, merge_pair(merges[k], where, k));
    const std::string product = lr.first + lr.second;
    if (!vocab.contains(lr.first) || !vocab.contains(lr.second) || !vocab.contains(product))
      return absl::InvalidArgumentError(absl::StrCat(where, ": model.merges[", k, "] ('", lr.first, "', '", lr.second,
                                                     "') names a token that is not in model.vocab"));
    if (auto it = last_rank.find(product); it != last_rank.end() && it->second + 1 != k)
      return absl::UnimplementedError(absl::StrCat(
          where, ": model.merges[", k, "] makes '", product, "' again after other merges (first at model.merges[",
          first_rank[product], "]); llama.cpp ranks merges by the score of the token they make, so one token's merges "
          "cannot be apart"));
    first_rank.try_emplace(product, k);
    last_rank[product] = k;
  }
  std::vector<std::pair<size_t, int64_t>> order;  // (first merge or none, id) of the normal pieces
  for (int64_t id = 0; id < vocab_size; ++id) {
    if (!v.filled[id] || added[id] || v.types[id] != kNormal) continue;
    const std::string& text = v.tokens[id];
    const auto it = first_rank.find(text);
    if (it == first_rank.end())
      for (size_t at : inner_char_starts(text))
        if (vocab.contains(text.substr(0, at)) && vocab.contains(text.substr(at)))
          return absl::UnimplementedError(absl::StrCat(
              where, ": token '", text, "' (id ", id, ") is '", text.substr(0, at), "' + '", text.substr(at),
              "' but no merge makes it; llama.cpp's SentencePiece tokenizer would make it where this BPE never does"));
    order.emplace_back(it == first_rank.end() ? std::numeric_limits<size_t>::max() : it->second, id);
  }
  std::sort(order.begin(), order.end());
  for (size_t pos = 0; pos < order.size(); ++pos) v.scores[order[pos].second] = -static_cast<float>(pos);
  return absl::OkStatus();
}

// The pieces of tokenizer.model as _create_vocab_sentencepiece reads them (IsUnknown, IsControl,
// IsUnused, IsByte, else NORMAL: a user-defined piece is NORMAL until an added token says otherwise).
absl::Status vocab_from_model(const SentencePieceModel& m, const std::string& where, int64_t vocab_size, SpmVocab& v) {
  if (m.model_type != SentencePieceModel::kBpe)
    return absl::UnimplementedError(absl::StrCat(
        where, ": trainer_spec.model_type is ", m.model_type, " (1 unigram, 2 bpe, 3 word, 4 char); llama.cpp's "
        "SentencePiece vocabulary merges pieces pairwise by score, which reproduces only a BPE model"));
  if (static_cast<int64_t>(m.pieces.size()) > vocab_size)
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", m.pieces.size(), " pieces for a model vocabulary of ",
                                                   vocab_size, " (config.json vocab_size)"));
  for (size_t id = 0; id < m.pieces.size(); ++id) {
    const auto& p = m.pieces[id];
    v.tokens[id] = p.piece;
    v.scores[id] = p.score;
    v.filled[id] = true;
    v.types[id] = (p.type == kUnknown || p.type == kControl || p.type == kUnused || p.type == kByte) ? p.type : kNormal;
  }
  return absl::OkStatus();
}

// The converter's added-token overrides: added_tokens.json (USER_DEFINED), then for phi3
// tokenizer_config.json's added_tokens_decoder and tokenizer.json's added_tokens (CONTROL when
// special), else tokenizer_config.json's added_tokens_decoder (CONTROL when special or looking
// special, USER_DEFINED with "▁" as spaces otherwise). transformers 5 no longer writes
// added_tokens_decoder: tokenizer.json's added_tokens, which it copied, stand in for it then.
absl::Status override_added_tokens(const fs::path& dir, const json* tj, const json& tc, const std::string& arch,
                                   int64_t vocab_size, SpmVocab& v) {
  auto set = [&](const std::string& file, const std::string& text, int64_t id, int32_t type) -> absl::Status {
    if (id < 0 || id >= vocab_size)
      return absl::InvalidArgumentError(absl::StrCat(file, ": added token '", text, "' has id ", id,
                                                     ", outside the model's vocabulary of ", vocab_size));
    v.tokens[id] = text;
    v.types[id] = type;
    v.scores[id] = -1000.0f;
    v.filled[id] = true;
    return absl::OkStatus();
  };
  const fs::path added_path = dir / "added_tokens.json";
  std::error_code ec;
  if (fs::exists(added_path, ec)) {
    LOOM_ASSIGN_OR_RETURN(const json added, read_json_file(added_path.string()));
    if (!added.is_object()) return absl::InvalidArgumentError(absl::StrCat(added_path.string(), ": expected an object of token: id"));
    for (const auto& [text, id] : added.items()) {
      if (!id.is_number_integer()) return absl::InvalidArgumentError(absl::StrCat(added_path.string(), ": '", text, "' has no integer id"));
      LOOM_RETURN_IF_ERROR(set(added_path.string(), text, id.get<int64_t>(), kUserDefined));
    }
  }
  struct Entry {
    std::string file, text;
    int64_t id;
    bool special;
  };
  std::vector<Entry> entries;
  const std::string tc_file = (dir / "tokenizer_config.json").string(), tj_file = (dir / "tokenizer.json").string();
  if (tc.is_object() && tc.contains("added_tokens_decoder") && tc["added_tokens_decoder"].is_object())
    for (const auto& [key, d] : tc["added_tokens_decoder"].items()) {
      int64_t id = -1;
      if (!absl::SimpleAtoi(key, &id) || !d.is_object() || !d.contains("content") || !d["content"].is_string())
        return absl::InvalidArgumentError(absl::StrCat(tc_file, ": added_tokens_decoder['", key, "'] is not {id: {content, ...}}"));
      entries.push_back({tc_file, d["content"].get<std::string>(), id, d.value("special", false)});
    }
  const bool phi3 = arch == "phi3";
  if (tj && (phi3 || entries.empty()))
    for (const json& a : tj->value("added_tokens", json::array()))
      if (a.is_object() && a.contains("content") && a["content"].is_string() && a.contains("id") && a["id"].is_number_integer())
        entries.push_back({tj_file, a["content"].get<std::string>(), a["id"].get<int64_t>(), a.value("special", false)});
  for (const Entry& e : entries) {
    if (phi3) {
      LOOM_RETURN_IF_ERROR(set(e.file, e.text, e.id, e.special ? kControl : kUserDefined));
    } else if (e.special || looks_special(e.text)) {
      LOOM_RETURN_IF_ERROR(set(e.file, e.text, e.id, kControl));
    } else {  // llama.cpp matches user-defined tokens in the text as it is, spaces unescaped
      LOOM_RETURN_IF_ERROR(set(e.file, replace_all(e.text, kSpace, " "), e.id, kUserDefined));
    }
  }
  return absl::OkStatus();
}

// Every token of tokenizer.json must be the GGUF token of its id (spaces and "▁" alike): else
// tokenizer.model and tokenizer.json describe different vocabularies.
absl::Status check_against_json(const json& tj, const std::string& where, const std::string& model_where, const SpmVocab& v) {
  // GemmaConverter names the "<0x09>" piece "\t" when the model lacks a tab piece: the same id either way.
  auto same = [](const std::string& gguf, const std::string& text) {
    return replace_all(gguf, " ", kSpace) == replace_all(text, " ", kSpace) || (gguf == "<0x09>" && text == "\t");
  };
  auto check = [&](const std::string& text, int64_t id) -> absl::Status {
    if (id < 0 || id >= static_cast<int64_t>(v.tokens.size()) || !v.filled[id] || !same(v.tokens[id], text))
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": id ", id, " is '", text, "' but ", model_where, " gives ",
          id >= 0 && id < static_cast<int64_t>(v.tokens.size()) && v.filled[id] ? absl::StrCat("'", v.tokens[id], "'") : "no token",
          "; the two files describe different vocabularies"));
    return absl::OkStatus();
  };
  for (const auto& [text, id] : tj["model"]["vocab"].items())
    if (id.is_number_integer()) LOOM_RETURN_IF_ERROR(check(text, id.get<int64_t>()));
  for (const json& a : tj.value("added_tokens", json::array()))
    if (a.is_object() && a.contains("content") && a["content"].is_string() && a.contains("id") && a["id"].is_number_integer())
      LOOM_RETURN_IF_ERROR(check(a["content"].get<std::string>(), a["id"].get<int64_t>()));
  return absl::OkStatus();
}

}  // namespace

bool is_sentencepiece_style(const json& tj) {
  if (!tj.is_object() || !tj.contains("model") || !tj["model"].is_object()) return false;
  const json& m = tj["model"];
  return m.value("type", "") == "Unigram" || (m.value("type", "") == "BPE" && m.value("byte_fallback", false));
}

absl::StatusOr<SpmVocab> sentencepiece_vocab(const fs::path& dir, const json* tj, const json& tc, const std::string& arch,
                                             int64_t vocab_size) {
  SpmVocab v;
  v.tokens.resize(vocab_size);
  for (int64_t id = 0; id < vocab_size; ++id) v.tokens[id] = absl::StrCat("[PAD", id, "]");
  v.scores.assign(vocab_size, -10000.0f);
  v.types.assign(vocab_size, kUnused);
  v.filled.assign(vocab_size, false);
  const std::string tj_where = (dir / "tokenizer.json").string(), model_where = (dir / "tokenizer.model").string();
  if (tj) {
    LOOM_ASSIGN_OR_RETURN(v.space_prefix, json_space_prefix(*tj, tj_where));
  }
  std::error_code ec;
  if (fs::exists(dir / "tokenizer.model", ec)) {
    LOOM_ASSIGN_OR_RETURN(const SentencePieceModel m, load_sentencepiece_model(model_where));
    if (!tj) {  // the model's own normalizer is then what transformers would build
      if (m.has_precompiled_charsmap || m.remove_extra_whitespaces || !m.escape_whitespaces)
        return absl::UnimplementedError(absl::StrCat(
            model_where, ": normalizer_spec '", m.normalizer_name, "' ",
            m.has_precompiled_charsmap ? "normalizes Unicode (precompiled_charsmap)"
            : m.remove_extra_whitespaces ? "removes extra whitespace" : "does not escape whitespace",
            "; llama.cpp's SentencePiece tokenizer only escapes spaces, so a GGUF file cannot reproduce it"));
      v.space_prefix = m.add_dummy_prefix;
    }
    LOOM_RETURN_IF_ERROR(vocab_from_model(m, model_where, vocab_size, v));
    LOOM_RETURN_IF_ERROR(override_added_tokens(dir, tj, tc, arch, vocab_size, v));
    if (tj) LOOM_RETURN_IF_ERROR(check_against_json(*tj, tj_where, model_where, v));
    return v;
  }
  if (!tj) return absl::NotFoundError(absl::StrCat(dir.string(), ": neither tokenizer.json nor tokenizer.model"));
  LOOM_RETURN_IF_ERROR(vocab_from_json(*tj, tj_where, vocab_size, v));
  LOOM_RETURN_IF_ERROR(override_added_tokens(dir, tj, tc, arch, vocab_size, v));
  return v;
}

}  // namespace loom::gguf_export
