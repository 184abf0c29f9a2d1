// `loom tokenize`: encodes text with a Hugging Face tokenizer.json and prints the token ids as JSON,
// one array per input (--text, or each record's "text" field of a JSONL file).
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "text/tokenizer.h"

namespace loom::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"tokenizer", false, "tokenizer.json, or a model folder holding one", ""},
    {"text", false, "text to encode", ""},
    {"input", false, "JSONL file: encodes each record's \"text\" field, one output line per record", ""},
    {"add-special-tokens", true, "add the post-processor's tokens (e.g. BOS)", ""},
    {"help", true, "show this help", ""},
};

int fail(const std::string& message) {
  std::fprintf(stderr, "loom tokenize: %s\n", message.c_str());
  return 1;
}

void print_ids(const std::vector<int32_t>& ids) {
  std::string line = "[";
  for (size_t i = 0; i < ids.size(); ++i) absl::StrAppend(&line, i ? ", " : "", ids[i]);
  line += "]\n";
  std::fputs(line.c_str(), stdout);
}

}  // namespace

int run_tokenize(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, kFlags);
  if (!args.ok()) return fail(std::string(args.status().message()));
  if (args->flag("help")) {
    std::fputs(usage("tokenize", kFlags).c_str(), stdout);
    return 0;
  }
  if (!args->has("tokenizer")) return fail("--tokenizer is required");
  if (args->has("text") == args->has("input")) return fail("give exactly one of --text and --input");
  auto tok = Tokenizer::load(args->str("tokenizer"));
  if (!tok.ok()) return fail(std::string(tok.status().message()));
  const bool add = args->flag("add-special-tokens");

  if (args->has("text")) {
    print_ids(tok->encode(args->str("text"), add));
    return 0;
  }
  const std::string path = args->str("input");
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) return fail(absl::StrCat(path, ": cannot open"));
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines carry no record
    nlohmann::json rec;
    try {
      rec = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return fail(absl::StrCat(path, ":", n, ": malformed JSON: ", e.what()));
    }
    if (!rec.is_object() || !rec.contains("text") || !rec["text"].is_string())
      return fail(absl::StrCat(path, ":", n, ": expected an object with a string \"text\" field"));
    print_ids(tok->encode(rec["text"].get<std::string>(), add));
  }
  return 0;
}

}  // namespace loom::cli
