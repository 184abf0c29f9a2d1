// GGUF SentencePiece-style vocabularies (tokenizer.ggml.model "llama") -> the tokenizer.json
// transformers builds from the same file (integrations/gguf: LlamaTokenizer, or GemmaTokenizer for
// gemma*, or a Prepend/Replace normalizer for phi3): BPE with byte fallback over the file's tokens,
// merges recovered from the scores (Gemma: from the token order) as its generate_merges recovers them.
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "text/gguf_tokenizer_internal.h"

namespace loom::gguf_tok {
namespace {

using nlohmann::json;

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 "▁"

// Byte offsets of the code-point starts of s (continuation bytes 10xxxxxx are skipped).
std::vector<size_t> char_starts(const std::string& s) {
  std::vector<size_t> out;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<uint8_t>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  return out;
}

bool all_spaces(const std::string& t) { return !t.empty() && t.find_first_not_of(' ') == std::string::npos; }

}  // namespace

std::vector<std::pair<std::string, std::string>> generate_merges(const std::vector<std::string>& tokens,
                                                                  const std::vector<double>& scores) {
  absl::flat_hash_map<std::string_view, int64_t> vocab;
  // Byte lengths some token has: a split is looked up only when both halves could be tokens, which
  // keeps a hostile file (one huge token) from costing its length squared.
  std::vector<bool> has_len;
  for (size_t id = 0; id < tokens.size(); ++id) {
    vocab[tokens[id]] = static_cast<int64_t>(id);
    if (tokens[id].size() >= has_len.size()) has_len.resize(tokens[id].size() + 1, false);
    has_len[tokens[id].size()] = true;
  }
  struct Merge {
    int64_t left, right;  // ids
    double score;
    size_t left_chars, right_chars;
  };
  std::vector<Merge> merges, local;
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string& t = tokens[id];
    const std::vector<size_t> starts = char_starts(t);
    local.clear();
    for (size_t k = 1; k < starts.size(); ++k) {
      if (!has_len[starts[k]] || !has_len[t.size() - starts[k]]) continue;
      const std::string_view l = std::string_view(t).substr(0, starts[k]), r = std::string_view(t).substr(starts[k]);
      auto il = vocab.find(l), ir = vocab.find(r);
      if (il == vocab.end() || ir == vocab.end()) continue;
      local.push_back({il->second, ir->second, scores[id], k, starts.size() - k});
    }
    std::stable_sort(local.begin(), local.end(),
                     [](const Merge& a, const Merge& b) { return std::tie(a.left, a.right) < std::tie(b.left, b.right); });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  // Best first: highest score, then the longer left piece, then the longer right piece; equal keys
  // keep their order (Python's stable sort with reverse=True).
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return std::tie(a.score, a.left_chars, a.right_chars) > std::tie(b.score, b.left_chars, b.right_chars);
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (const Merge& m : merges) out.emplace_back(tokens[m.left], tokens[m.right]);
  return out;
}

absl::StatusOr<HfTokenizerFiles> sentencepiece_tokenizer(const GgufFile& f, const std::string& arch) {
  // llama.cpp writes "default" for these vocabularies, and transformers ignores tokenizer.ggml.pre
  // except for the names of a byte-level split regex, which it puts in front of any vocabulary.
  const std::string pre = f.get_string("tokenizer.ggml.pre").value_or("default");
  static constexpr const char* kSplitPres[] = {
      "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
      "jina-v5-nano", "dbrx", "smaug-bpe", "tekken", "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2",
      "megrez", "qwen35", "gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"};
  for (const char* name : kSplitPres)
    if (pre == name)
      return absl::UnimplementedError(absl::StrCat(
          f.path(), ": tokenizer.ggml.pre is '", pre, "' on a SentencePiece ('llama') vocabulary; transformers gives "
          "that a byte-level pre-tokenizer, which Loom does not convert"));
  LOOM_ASSIGN_OR_RETURN(const std::vector<std::string> file_tokens, f.get_strings("tokenizer.ggml.tokens"));
  LOOM_ASSIGN_OR_RETURN(const std::vector<int64_t> types, token_types(f, file_tokens.size()));
  const bool gemma = arch == "gemma" || arch == "gemma2" || arch == "gemma3";
  const bool phi3 = arch == "phi3";
  // Gemma files spell whitespace-run pieces with real spaces; GemmaTokenizer looks them up as "▁▁".
  std::vector<std::string> tokens = file_tokens;
  if (gemma)
    for (std::string& t : tokens)
      if (t.size() >= 2 && all_spaces(t)) {
        const size_t n = t.size();
        t.clear();
        for (size_t i = 0; i < n; ++i) t += kSpace;
      }
  LOOM_ASSIGN_OR_RETURN(json vocab, vocab_of(f, tokens));

  json merges = json::array();
  if (f.has("tokenizer.ggml.merges")) {
    LOOM_ASSIGN_OR_RETURN(const auto pairs, merge_pairs(f));
    for (const auto& [l, r] : pairs) merges.push_back({l, r});
  } else {
    if (!f.has("tokenizer.ggml.scores"))
      return absl::InvalidArgumentError(absl::StrCat(
          f.path(), ": tokenizer.ggml.scores is missing; a SentencePiece ('llama') vocabulary without "
                    "tokenizer.ggml.merges needs a score per token to order its merges"));
    LOOM_ASSIGN_OR_RETURN(std::vector<double> scores, f.get_floats("tokenizer.ggml.scores"));
    if (scores.size() != tokens.size())
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tokenizer.ggml.scores has ", scores.size(),
                                                     " entries for ", tokens.size(), " tokens"));
    for (size_t id = 0; id < scores.size(); ++id) {
      if (gemma)  // Gemma's scores do not follow its merge order; the token order does.
        scores[id] = -static_cast<double>(id);
      else if (std::isnan(scores[id]))  // no order to sort by
        return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tokenizer.ggml.scores[", id, "] is NaN"));
    }
    for (auto& [l, r] : generate_merges(tokens, scores)) merges.push_back({std::move(l), std::move(r)});
  }

  // Added tokens, in the order transformers adds them; a text not in the vocabulary gets the next id.
  std::map<int64_t, json> added;
  absl::flat_hash_map<std::string, int64_t> new_ids;
  int64_t next_id = static_cast<int64_t>(tokens.size());
  auto add = [&](const std::string& content, bool special) {
    int64_t id;
    if (auto it = vocab.find(content); it != vocab.end()) id = it->get<int64_t>();
    else if (auto n = new_ids.find(content); n != new_ids.end()) id = n->second;
    else id = new_ids[content] = next_id++;
    if (!added.contains(id)) added[id] = added_token(content, id, special, false);
  };
  // The special tokens of the class transformers builds the vocabulary with (their defaults).
  const std::vector<std::string> defaults = gemma ? std::vector<std::string>{"<bos>", "<eos>", "<unk>", "<pad>", "<mask>"}
                                                  : std::vector<std::string>{"<s>", "</s>", "<unk>"};
  for (const std::string& t : defaults) add(t, true);
  for (size_t id = 0; id < types.size(); ++id)
    if (types[id] == kTypeControl) add(file_tokens[id], true);
  for (size_t id = 0; id < types.size(); ++id)
    if (types[id] == kTypeUserDefined && vocab.contains(file_tokens[id])) add(file_tokens[id], false);

  json config = json::object();
  std::string bos, eos;
  int64_t bos_id = -1, eos_id = -1;
  for (const auto& [key, field] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token"},
                                   std::pair{"tokenizer.ggml.eos_token_id", "eos_token"},
                                   std::pair{"tokenizer.ggml.unknown_token_id", "unk_token"},
                                   std::pair{"tokenizer.ggml.padding_token_id", "pad_token"}}) {
    if (!f.has(key)) continue;
    LOOM_ASSIGN_OR_RETURN(const int64_t id, f.get_int(key));
    if (id < 0 || id >= static_cast<int64_t>(tokens.size()))
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": ", key, " is ", id, ", outside the ", tokens.size(), " tokens"));
    config[field] = file_tokens[id];
    add(file_tokens[id], true);
    if (std::string_view(field) == "bos_token") bos = file_tokens[id];
    if (std::string_view(field) == "eos_token") eos = file_tokens[id];
  }
  if (gemma) config["mask_token"] = "<mask>";
  auto id_of = [&](const std::string& t) -> int64_t {
    if (auto it = vocab.find(t); it != vocab.end()) return it->get<int64_t>();
    return new_ids.at(t);
  };
  if (!bos.empty()) bos_id = id_of(bos);
  if (!eos.empty()) eos_id = id_of(eos);
  // llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise, and so does transformers.
  const bool add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(true);
  const bool add_eos = f.get_bool("tokenizer.ggml.add_eos_token").value_or(false);

  const json replace_space = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}};
  json normalizer = nullptr, pre_tokenizer = nullptr;
  json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                               {{"type", "ByteFallback"}},
                               {{"type", "Fuse"}}});
  if (gemma) {  // GemmaTokenizer: spaces -> "▁", no prefix; its Split on " " then finds none
    normalizer = replace_space;
    pre_tokenizer = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}};
  } else {
    if (phi3)  // the prefix from a normalizer, so "  hi" keeps both spaces
      normalizer = {{"type", "Sequence"},
                    {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", kSpace}}, replace_space})}};
    else  // LlamaTokenizer (legacy=False): "▁" before the text's start only, unless it starts with a space
      pre_tokenizer = {{"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", "first"}, {"split", false}};
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }

  json added_list = json::array(), added_decoder = json::object();
  for (auto& [id, a] : added) {
    added_list.push_back(a);
    json d = a;
    d.erase("id");
    added_decoder[std::to_string(id)] = d;
  }
  HfTokenizerFiles out;
  out.tokenizer_json = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added_list},
      {"normalizer", normalizer},
      {"pre_tokenizer", pre_tokenizer},
      {"post_processor", template_processing(add_bos ? bos : "", bos_id, add_eos ? eos : "", eos_id)},
      {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", gemma ? json("<unk>") : json(nullptr)},
        {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", true},
        {"byte_fallback", true}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}}},
  };
  config["add_bos_token"] = add_bos;
  config["add_eos_token"] = add_eos;
  config["added_tokens_decoder"] = added_decoder;
  config["clean_up_tokenization_spaces"] = false;
  if (auto tmpl = f.get_string("tokenizer.chat_template"); tmpl.ok()) config["chat_template"] = *tmpl;
  if (auto ctx = f.get_int(arch + ".context_length"); ctx.ok()) config["model_max_length"] = *ctx;
  config["tokenizer_class"] = gemma ? "GemmaTokenizer" : "LlamaTokenizer";
  out.tokenizer_config_json = config;
  return out;
}

}  // namespace loom::gguf_tok
