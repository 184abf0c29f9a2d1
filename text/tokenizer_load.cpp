// Tokenizer::load: tokenizer.json (or a GGUF's vocabulary) into the pipeline of
// tokenizer_pipeline_internal.h, with errors that name the file and the field.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/model_path.h"
#include "text/gguf_tokenizer.h"
#include "text/tokenizer_pipeline_internal.h"

namespace loom {

using json = nlohmann::json;

namespace {

absl::Status bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// The most token ids a vocabulary may span: 16 times the largest real one (Gemma's 262,144). The
// tables are indexed by id, so an id of 10^9 in a damaged file would ask for tens of gigabytes.
constexpr int64_t kMaxTokenIds = int64_t{1} << 22;

// Every id of model.vocab below kMaxTokenIds (checked before the BPE model sizes its tables by the
// largest one); other malformations (ids outside [0, 2^31), wrong types) are left to Bpe::load.
absl::Status check_vocab_ids(const json& model, const std::string& path) {
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) return absl::OkStatus();
  for (auto it = vocab->begin(); it != vocab->end(); ++it)
    if (it->is_number_integer() && it->get<int64_t>() >= kMaxTokenIds && it->get<int64_t>() <= INT32_MAX)
      return bad(path, absl::StrCat("model.vocab[\"", it.key(), "\"]: id ", it->dump(), " is beyond any real vocabulary (ids ",
                                    "must be below ", kMaxTokenIds, "): the file is damaged"));
  return absl::OkStatus();
}

std::string type_of(const json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "?"; }

// Replace's pattern: {"String": s}; a {"Regex": ...} pattern is not supported.
absl::StatusOr<std::string> string_pattern(const json& j, const std::string& path, const std::string& where) {
  auto p = j.find("pattern");
  if (p != j.end() && p->is_object() && p->contains("String") && (*p)["String"].is_string())
    return (*p)["String"].get<std::string>();
  return bad(path, absl::StrCat(where, ": only {\"String\": ...} patterns are supported"));
}

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

}  // namespace

absl::Status Tokenizer::Impl::parse_added(const json& j) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_array()) return bad(path, "added_tokens: expected an array");
  for (const auto& t : j) {
    if (!t.is_object() || !t.contains("content") || !t.contains("id") || !t["content"].is_string() ||
        !t["id"].is_number_integer())
      return bad(path, "added_tokens: each entry needs \"content\" and \"id\"");
    AddedToken a;
    a.content = t["content"].get<std::string>();
    const std::optional<int32_t> id = tok::json_token_id(t["id"]);
    if (!id) return bad(path, absl::StrCat("added_tokens: \"", a.content, "\" has id ", t["id"].dump(), ", outside [0, 2^31)"));
    if (*id >= kMaxTokenIds)
      return bad(path, absl::StrCat("added_tokens: \"", a.content, "\" has id ", *id, ", beyond any real vocabulary (ids must ",
                                    "be below ", kMaxTokenIds, "): the file is damaged"));
    a.id = *id;
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
  constexpr const char* kExpected = "a model folder, a .gguf file or a tokenizer.json";
  if (absl::Status s = check_input_path(path_in, "model or tokenizer path", kExpected); !s.ok()) return s;
  std::string path = path_in;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    path += "/tokenizer.json";
    if (!std::filesystem::exists(path, ec))
      return absl::NotFoundError(absl::StrCat(path_in, ": no tokenizer.json in this folder (a Hugging Face model ",
                                              "folder ships one next to config.json)"));
  }
  const PathKind kind = sniff_path(path);
  if (kind != PathKind::kJson && kind != PathKind::kGguf && !path.ends_with(".gguf") && kind != PathKind::kMissing)
    return wrong_kind(path, kind, kExpected);
  json j;
  if ((path.size() > 5 && path.ends_with(".gguf")) || kind == PathKind::kGguf) {  // a llama.cpp file: its tokenizer.ggml.* metadata
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
    if (auto s = check_vocab_ids(j["model"], path); !s.ok()) return s;
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
}  // namespace loom
