// Hugging Face tokenizer files -> GGUF tokenizer metadata (convert_hf_to_gguf.py's get_vocab_base or
// _set_vocab_sentencepiece, and gguf-py's SpecialVocab): byte-level BPE as tokens by id, token types
// (1 normal, 3 control = special added token, 4 user-defined = other added token, 5 unused = padding
// id) and merges; SentencePiece-style tokenizers as tokens, scores and types (gguf_tokenizer_export_spm.cpp);
// then bos/eos/padding/unknown ids, add_bos/add_eos and the chat template.
#include "train/gguf_tokenizer_export.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/json_file.h"
#include "engine/status_macros.h"
#include "models/gguf_model.h"
#include "nlohmann/json.hpp"
#include "text/gguf_tokenizer.h"
#include "train/gguf_tokenizer_export_internal.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

absl::StatusOr<json> read_json(const fs::path& path, bool required) {
  std::error_code ec;
  if (!required && !fs::exists(path, ec)) return json(nullptr);
  auto j = read_json_file(path.string());
  if (!j.ok() && absl::IsNotFound(j.status()))
    return absl::NotFoundError(absl::StrCat(j.status().message(), " (GGUF export needs the model's tokenizer)"));
  return j;
}

// A tokenizer_config.json special token: "text" or {"content": "text", ...}.
std::string token_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

// Whether the post-processor inserts `token` (a TemplateProcessing's `single`, possibly in a Sequence).
bool post_processor_adds(const json& post, const std::string& token, bool first) {
  if (!post.is_object()) return false;
  if (post.value("type", "") == "Sequence" && post.contains("processors")) {
    for (const json& p : post["processors"])
      if (post_processor_adds(p, token, first)) return true;
    return false;
  }
  if (post.value("type", "") != "TemplateProcessing" || !post.contains("single") || post["single"].empty()) return false;
  const json& item = first ? post["single"].front() : post["single"].back();
  return item.contains("SpecialToken") && item["SpecialToken"].value("id", "") == token;
}

absl::Status add_from_gguf(const std::string& path, int64_t vocab_size, GgufWriter& w) {
  LOOM_ASSIGN_OR_RETURN(GgufFile f, GgufFile::open(path));
  LOOM_ASSIGN_OR_RETURN(const std::vector<std::string> tokens, f.get_strings("tokenizer.ggml.tokens"));
  if (static_cast<int64_t>(tokens.size()) != vocab_size)
    return absl::InvalidArgumentError(absl::StrCat(path, ": tokenizer.ggml.tokens has ", tokens.size(),
                                                   " tokens for a vocabulary of ", vocab_size));
  for (const GgufKv& kv : f.metadata())
    if (kv.key.starts_with("tokenizer.")) w.add(kv.key, kv.value);
  return absl::OkStatus();
}

// The byte-level BPE vocabulary of tokenizer.json (convert_hf_to_gguf.py's get_vocab_base): tokens
// by id, types, merges, tokenizer.ggml.pre.
absl::Status add_byte_level(const json& tj, const std::string& where, int64_t vocab_size, std::vector<std::string>& tokens,
                            std::vector<bool>& seen, GgufWriter& w) {
  if (!tj.contains("model") || !tj["model"].is_object() || tj["model"].value("type", "") != "BPE" ||
      !tj["model"].contains("vocab") || !tj["model"]["vocab"].is_object())
    return absl::UnimplementedError(absl::StrCat(where, ": model.type is not BPE with a vocab; GGUF export writes "
                                                 "byte-level BPE (tokenizer.ggml.model gpt2) and SentencePiece-style "
                                                 "(llama) tokenizers"));
  const std::string pre = gguf_pre_tokenizer_name(tj);
  if (pre.empty())
    return absl::UnimplementedError(absl::StrCat(where, ": pre_tokenizer ", tj.value("pre_tokenizer", json()).dump(),
                                                 " matches none of llama.cpp's smollm, gpt-2, llama-bpe, qwen2"));

  tokens.assign(vocab_size, "");
  std::vector<int32_t> types(vocab_size, kUnused);
  seen.assign(vocab_size, false);
  auto place = [&](const std::string& text, int64_t id, int32_t type, const char* field) -> absl::Status {
    if (id < 0 || id >= vocab_size)
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, " '", text, "' has id ", id,
                                                     ", outside the model's vocabulary of ", vocab_size));
    tokens[id] = text;
    types[id] = type;
    seen[id] = true;
    return absl::OkStatus();
  };
  for (const auto& [text, id] : tj["model"]["vocab"].items()) {
    if (!id.is_number_integer()) return absl::InvalidArgumentError(absl::StrCat(where, ": model.vocab['", text, "'] is not an id"));
    LOOM_RETURN_IF_ERROR(place(text, id.get<int64_t>(), kNormal, "model.vocab token"));
  }
  if (tj.contains("added_tokens"))
    for (const json& a : tj["added_tokens"]) {
      if (!a.contains("id") || !a.contains("content"))
        return absl::InvalidArgumentError(absl::StrCat(where, ": an added_tokens entry lacks id or content"));
      LOOM_RETURN_IF_ERROR(place(a["content"].get<std::string>(), a["id"].get<int64_t>(),
                                 a.value("special", false) ? kControl : kUserDefined, "added token"));
    }
  for (int64_t id = 0; id < vocab_size; ++id)
    if (!seen[id]) tokens[id] = absl::StrCat("[PAD", id, "]");

  std::vector<std::string> merges;
  if (tj["model"].contains("merges"))
    for (const json& m : tj["model"]["merges"]) {
      if (m.is_string()) merges.push_back(m.get<std::string>());
      else if (m.is_array() && m.size() == 2) merges.push_back(absl::StrCat(m[0].get<std::string>(), " ", m[1].get<std::string>()));
      else return absl::InvalidArgumentError(absl::StrCat(where, ": model.merges holds ", m.dump(), ", expected 'a b' or [a, b]"));
    }

  w.add("tokenizer.ggml.model", gguf_string("gpt2"));
  w.add("tokenizer.ggml.pre", gguf_string(pre));
  w.add("tokenizer.ggml.tokens", gguf_strings(tokens));
  w.add("tokenizer.ggml.token_type", gguf_i32s(types));
  w.add("tokenizer.ggml.merges", gguf_strings(merges));
  return absl::OkStatus();
}

// A SentencePiece-style vocabulary (train/gguf_tokenizer_export_spm.cpp) as _set_vocab_sentencepiece
// writes it: tokenizer.ggml.model "llama", tokenizer.ggml.pre "default", no merges.
absl::Status add_sentencepiece(const fs::path& dir, const json* tj, const json& tc, const std::string& arch,
                               int64_t vocab_size, std::vector<std::string>& tokens, std::vector<bool>& seen, GgufWriter& w) {
  LOOM_ASSIGN_OR_RETURN(gguf_export::SpmVocab v, gguf_export::sentencepiece_vocab(dir, tj, tc, arch, vocab_size));
  w.add("tokenizer.ggml.model", gguf_string("llama"));
  w.add("tokenizer.ggml.pre", gguf_string("default"));
  w.add("tokenizer.ggml.tokens", gguf_strings(v.tokens));
  w.add("tokenizer.ggml.scores", gguf_f32s(v.scores));
  w.add("tokenizer.ggml.token_type", gguf_i32s(v.types));
  if (!v.space_prefix) w.add("tokenizer.ggml.add_space_prefix", gguf_bool(false));
  tokens = std::move(v.tokens);
  seen = std::move(v.filled);
  return absl::OkStatus();
}

absl::Status add_from_folder(const fs::path& dir, int64_t vocab_size, const std::string& arch, GgufWriter& w) {
  const fs::path tj_path = dir / "tokenizer.json";
  std::error_code ec;
  const bool has_model = fs::exists(dir / "tokenizer.model", ec);
  LOOM_ASSIGN_OR_RETURN(const json tj, read_json(tj_path, !has_model));
  LOOM_ASSIGN_OR_RETURN(const json tc, read_json(dir / "tokenizer_config.json", false));
  LOOM_ASSIGN_OR_RETURN(const json cfg, read_json(dir / "config.json", false));
  const std::string where = tj_path.string();
  std::vector<std::string> tokens;
  std::vector<bool> seen;
  const bool spm = tj.is_null() || gguf_export::is_sentencepiece_style(tj);
  if (spm) LOOM_RETURN_IF_ERROR(add_sentencepiece(dir, tj.is_null() ? nullptr : &tj, tc, arch, vocab_size, tokens, seen, w));
  else LOOM_RETURN_IF_ERROR(add_byte_level(tj, where, vocab_size, tokens, seen, w));

  // Special ids: tokenizer_config.json's tokens, else config.json's ids (as SpecialVocab reads them).
  auto id_of = [&](const std::string& text) -> int64_t {
    for (int64_t id = 0; id < vocab_size; ++id)
      if (seen[id] && tokens[id] == text) return id;
    return -1;
  };
  std::string bos_text;
  for (const auto& [field, key, cfg_key] : {std::tuple{"bos_token", "tokenizer.ggml.bos_token_id", "bos_token_id"},
                                            std::tuple{"eos_token", "tokenizer.ggml.eos_token_id", "eos_token_id"},
                                            std::tuple{"pad_token", "tokenizer.ggml.padding_token_id", "pad_token_id"},
                                            std::tuple{"unk_token", "tokenizer.ggml.unknown_token_id", ""}}) {
    int64_t id = -1;
    if (tc.is_object() && tc.contains(field) && !tc[field].is_null()) {
      const std::string text = token_text(tc[field]);
      id = id_of(text);
      if (id < 0)
        return absl::InvalidArgumentError(absl::StrCat((dir / "tokenizer_config.json").string(), ": ", field, " '", text,
                                                       "' is not in the vocabulary"));
      if (std::string(field) == "bos_token") bos_text = text;
    } else if (*cfg_key && cfg.is_object() && cfg.contains(cfg_key)) {
      const json& v = cfg[cfg_key];
      if (v.is_number_integer()) id = v.get<int64_t>();
      else if (v.is_array() && !v.empty() && v[0].is_number_integer()) id = v[0].get<int64_t>();
      if (id >= vocab_size) id = -1;
      if (id >= 0 && std::string(field) == "bos_token") bos_text = tokens[id];
    }
    if (id >= 0) w.add(key, gguf_u32(static_cast<uint32_t>(id)));
  }
  // A SentencePiece tokenizer known only by tokenizer.model adds BOS, as transformers' LlamaTokenizer does.
  const json post = tj.is_object() ? tj.value("post_processor", json()) : json();
  bool add_bos = tj.is_null() ? spm : !bos_text.empty() && post_processor_adds(post, bos_text, true);
  if (tc.is_object() && tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean()) add_bos = tc["add_bos_token"].get<bool>();
  bool add_eos = false;
  if (tc.is_object() && tc.contains("add_eos_token") && tc["add_eos_token"].is_boolean()) add_eos = tc["add_eos_token"].get<bool>();
  w.add("tokenizer.ggml.add_bos_token", gguf_bool(add_bos));
  w.add("tokenizer.ggml.add_eos_token", gguf_bool(add_eos));

  std::string tmpl;
  if (tc.is_object() && tc.contains("chat_template")) {
    const json& t = tc["chat_template"];
    if (t.is_string()) tmpl = t.get<std::string>();
    else if (t.is_array())  // named templates: the "default" one, as transformers picks it
      for (const json& e : t)
        if (e.value("name", "") == "default") tmpl = e.value("template", "");
  }
  if (tmpl.empty()) {
    std::ifstream jin(dir / "chat_template.jinja");
    if (jin) {
      std::ostringstream ss;
      ss << jin.rdbuf();
      tmpl = ss.str();
    }
  }
  if (!tmpl.empty()) w.add("tokenizer.chat_template", gguf_string(tmpl));
  return absl::OkStatus();
}

}  // namespace

absl::Status add_gguf_tokenizer(const std::string& model_path, int64_t vocab_size, const std::string& arch, GgufWriter& w) {
  if (is_gguf_path(model_path)) return add_from_gguf(model_path, vocab_size, w);
  return add_from_folder(fs::path(model_path), vocab_size, arch, w);
}

}  // namespace loom
