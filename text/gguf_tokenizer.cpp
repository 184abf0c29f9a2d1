// GGUF tokenizer metadata -> Hugging Face tokenizer files. Byte-level BPE ("gpt2") here: the
// pre-tokenizer of each tokenizer.ggml.pre is the one llama.cpp's convert_hf_to_gguf.py recognised
// it from (its get_vocab_base_pre hashes the tokenizer.json pre-tokenizer); token types 3 (control)
// and 4 (user-defined) are the tokenizer.json added tokens. SentencePiece ("llama"):
// text/gguf_tokenizer_spm.cpp.
#include "text/gguf_tokenizer.h"

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "text/gguf_tokenizer_internal.h"

namespace loom {

namespace gguf_tok {

using nlohmann::json;

absl::StatusOr<std::vector<int64_t>> token_types(const GgufFile& f, size_t n_tokens) {
  std::vector<int64_t> types(n_tokens, kTypeNormal);
  if (!f.has("tokenizer.ggml.token_type")) return types;
  LOOM_ASSIGN_OR_RETURN(types, f.get_ints("tokenizer.ggml.token_type"));
  if (types.size() != n_tokens)
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tokenizer.ggml.token_type has ", types.size(),
                                                   " entries for ", n_tokens, " tokens"));
  for (size_t id = 0; id < types.size(); ++id)
    if (types[id] < 0 || types[id] > kTypeByte)
      return absl::InvalidArgumentError(absl::StrCat(
          f.path(), ": tokenizer.ggml.token_type[", id, "] is ", types[id],
          ", not a llama.cpp token type (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)"));
  return types;
}

absl::StatusOr<json> vocab_of(const GgufFile& f, const std::vector<std::string>& tokens) {
  json vocab = json::object();
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (vocab.contains(tokens[id]))
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": tokenizer.ggml.tokens[", id, "] '", tokens[id], "' repeats an earlier token"));
    vocab[tokens[id]] = id;
  }
  return vocab;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> merge_pairs(const GgufFile& f) {
  LOOM_ASSIGN_OR_RETURN(const std::vector<std::string> merges, f.get_strings("tokenizer.ggml.merges"));
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const size_t sp = merges[i].find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == merges[i].size())
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": tokenizer.ggml.merges[", i, "] is '", merges[i], "', expected 'left right'"));
    out.emplace_back(merges[i].substr(0, sp), merges[i].substr(sp + 1));
  }
  return out;
}

json added_token(const std::string& content, int64_t id, bool special, bool normalized) {
  return {{"id", id},           {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},    {"normalized", normalized}, {"special", special}};
}

json template_processing(const std::string& bos, int64_t bos_id, const std::string& eos, int64_t eos_id) {
  json single = json::array(), pair = json::array(), specials = json::object();
  auto special = [&](const std::string& t, int64_t id, int type_id) {
    specials[t] = {{"id", t}, {"ids", {id}}, {"tokens", {t}}};
    return json{{"SpecialToken", {{"id", t}, {"type_id", type_id}}}};
  };
  for (int type_id = 0; type_id < 2; ++type_id) {
    json& seq = type_id == 0 ? single : pair;
    if (type_id == 1) pair = single;
    if (!bos.empty()) seq.push_back(special(bos, bos_id, type_id));
    seq.push_back({{"Sequence", {{"id", type_id == 0 ? "A" : "B"}, {"type_id", type_id}}}});
    if (!eos.empty()) seq.push_back(special(eos, eos_id, type_id));
  }
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}};
}

}  // namespace gguf_tok

namespace {

using nlohmann::json;
using gguf_tok::kTypeControl;
using gguf_tok::kTypeUserDefined;

constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json byte_level(bool add_prefix_space, bool trim_offsets, bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", trim_offsets},
          {"use_regex", use_regex}};
}

json split(const char* regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
}

// (normalizer, pre_tokenizer) for a tokenizer.ggml.pre value; null pre_tokenizer when unknown.
std::pair<json, json> pre_tokenizer_for(const std::string& pre) {
  if (pre == "smollm" || pre == "starcoder" || pre == "refact")
    return {nullptr, {{"type", "Sequence"},
                      {"pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                                     byte_level(false, true, true)})}}};
  if (pre == "gpt-2" || pre == "default") return {nullptr, byte_level(false, true, true)};
  if (pre == "llama-bpe" || pre == "llama3")
    return {nullptr, {{"type", "Sequence"}, {"pretokenizers", json::array({split(kLlama3Regex), byte_level(false, true, false)})}}};
  if (pre == "qwen2")
    return {{{"type", "NFC"}},
            {{"type", "Sequence"}, {"pretokenizers", json::array({split(kQwen2Regex), byte_level(false, false, false)})}}};
  return {nullptr, nullptr};
}

}  // namespace

std::string gguf_pre_tokenizer_name(const json& tokenizer_json) {
  const json none = nullptr;
  const json& normalizer = tokenizer_json.contains("normalizer") ? tokenizer_json["normalizer"] : none;
  const json& pre = tokenizer_json.contains("pre_tokenizer") ? tokenizer_json["pre_tokenizer"] : none;
  for (const char* name : {"smollm", "gpt-2", "llama-bpe", "qwen2"}) {
    const auto [n, p] = pre_tokenizer_for(name);
    if (n == normalizer && p == pre) return name;
  }
  return "";
}

absl::StatusOr<HfTokenizerFiles> gguf_hf_tokenizer(const GgufFile& f) {
  LOOM_ASSIGN_OR_RETURN(const std::string model, f.get_string("tokenizer.ggml.model"));
  if (model == "llama") return gguf_tok::sentencepiece_tokenizer(f, f.get_string("general.architecture").value_or(""));
  if (model != "gpt2")
    return absl::UnimplementedError(absl::StrCat(f.path(), ": tokenizer.ggml.model is '", model,
                                                 "'; Loom converts byte-level BPE ('gpt2') and SentencePiece "
                                                 "('llama') tokenizers so far"));
  const std::string pre = f.get_string("tokenizer.ggml.pre").value_or("default");
  auto [normalizer, pre_tokenizer] = pre_tokenizer_for(pre);
  if (pre_tokenizer.is_null())
    return absl::UnimplementedError(absl::StrCat(f.path(), ": tokenizer.ggml.pre is '", pre,
                                                 "'; known: smollm, starcoder, refact, gpt-2, default, llama-bpe, qwen2"));
  LOOM_ASSIGN_OR_RETURN(const std::vector<std::string> tokens, f.get_strings("tokenizer.ggml.tokens"));
  LOOM_ASSIGN_OR_RETURN(const std::vector<std::string> merges, f.get_strings("tokenizer.ggml.merges"));
  LOOM_ASSIGN_OR_RETURN(const std::vector<int64_t> types, gguf_tok::token_types(f, tokens.size()));
  json vocab = json::object(), added = json::array(), added_decoder = json::object();
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (vocab.contains(tokens[id]))
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": tokenizer.ggml.tokens[", id, "] '", tokens[id], "' repeats an earlier token"));
    vocab[tokens[id]] = id;
    if (types[id] != kTypeControl && types[id] != kTypeUserDefined) continue;
    const bool special = types[id] == kTypeControl;
    json a = {{"content", tokens[id]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
              {"normalized", !special}, {"special", special}};
    added_decoder[std::to_string(id)] = a;
    a["id"] = id;
    added.push_back(a);
  }
  for (size_t i = 0; i < merges.size(); ++i) {
    const size_t sp = merges[i].find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == merges[i].size())
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": tokenizer.ggml.merges[", i, "] is '", merges[i], "', expected 'left right'"));
  }

  // Special token ids -> their strings.
  json config = json::object();
  auto token_of = [&](const char* key, const char* field) -> absl::Status {
    auto id = f.get_int(key);
    if (!id.ok()) return absl::OkStatus();
    if (*id < 0 || *id >= static_cast<int64_t>(tokens.size()))
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", key, " is ", *id, ", outside the ", tokens.size(), " tokens"));
    config[field] = tokens[*id];
    return absl::OkStatus();
  };
  LOOM_RETURN_IF_ERROR(token_of("tokenizer.ggml.bos_token_id", "bos_token"));
  LOOM_RETURN_IF_ERROR(token_of("tokenizer.ggml.eos_token_id", "eos_token"));
  LOOM_RETURN_IF_ERROR(token_of("tokenizer.ggml.padding_token_id", "pad_token"));
  LOOM_RETURN_IF_ERROR(token_of("tokenizer.ggml.unknown_token_id", "unk_token"));
  const bool is_llama3 = pre == "llama-bpe" || pre == "llama3";
  const bool add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(is_llama3);
  const bool add_eos = f.get_bool("tokenizer.ggml.add_eos_token").value_or(false);

  json post = byte_level(true, false, true);
  if ((add_bos && config.contains("bos_token")) || (add_eos && config.contains("eos_token"))) {
    json single = json::array(), pair = json::array(), specials = json::object();
    auto special = [&](const char* field, const char* key) {
      const std::string t = config[field];
      const int64_t id = *f.get_int(key);
      specials[t] = {{"id", t}, {"ids", {id}}, {"tokens", {t}}};
      return json{{"SpecialToken", {{"id", t}, {"type_id", 0}}}};
    };
    if (add_bos) single.push_back(special("bos_token", "tokenizer.ggml.bos_token_id"));
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    if (add_eos) single.push_back(special("eos_token", "tokenizer.ggml.eos_token_id"));
    pair = single;
    for (const json& item : single) {
      json b = item;
      if (b.contains("Sequence")) b["Sequence"]["id"] = "B";
      for (auto it = b.begin(); it != b.end(); ++it) (*it)["type_id"] = 1;
      pair.push_back(b);
    }
    post = {{"type", "Sequence"},
            {"processors", json::array({byte_level(true, false, false),
                                        {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair},
                                         {"special_tokens", specials}}})}};
  }

  HfTokenizerFiles out;
  out.tokenizer_json = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", normalizer},
      {"pre_tokenizer", pre_tokenizer},
      {"post_processor", post},
      {"decoder", byte_level(true, true, true)},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", is_llama3},
        {"vocab", vocab}, {"merges", merges}}},
  };
  config["add_bos_token"] = add_bos;
  config["add_eos_token"] = add_eos;
  config["add_prefix_space"] = false;
  config["added_tokens_decoder"] = added_decoder;
  config["clean_up_tokenization_spaces"] = false;
  if (auto tmpl = f.get_string("tokenizer.chat_template"); tmpl.ok()) config["chat_template"] = *tmpl;
  const std::string arch = f.get_string("general.architecture").value_or("");
  if (auto ctx = f.get_int(arch + ".context_length"); ctx.ok()) config["model_max_length"] = *ctx;
  config["tokenizer_class"] = pre == "smollm" || pre == "starcoder" || pre == "gpt-2" ? "GPT2Tokenizer"
                              : pre == "qwen2"                                        ? "Qwen2Tokenizer"
                                                                                      : "PreTrainedTokenizerFast";
  out.tokenizer_config_json = config;
  return out;
}

}  // namespace loom
