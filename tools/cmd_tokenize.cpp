// `loom tokenize`: encodes text with a Hugging Face tokenizer.json and prints the token ids as JSON,
// one array per input: --text, or each record of a JSONL file rendered exactly as `loom train` does
// (any shape `loom train` reads). --show prints each record's text with the trained spans marked
// instead: green on a terminal, else between [[ and ]] (as Axolotl's preprocess --debug shows them).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "train/data.h"

namespace loom::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"tokenizer", false, "tokenizer.json, or a model folder holding one", ""},
    {"text", false, "text to encode", ""},
    {"input", false, "JSONL training data: each record tokenized as `loom train` does, one output line per record", ""},
    {"chat-template", false, "for --input: a .jinja file, or chatml (default: the model's own chat_template)", ""},
    {"add-special-tokens", true, "for --text: add the post-processor's tokens (e.g. BOS)", ""},
    {"show", true,
     "for --input: print each record's text (the tokens decoded, special tokens included) with the tokens the loss "
     "is taken on in green on a terminal, else between [[ and ]]", ""},
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

// The record decoded run by run of equal targets, the target runs marked.
std::string show(const Example& ex, const Tokenizer& tok, bool colour) {
  const char* open = colour ? "\x1b[32m" : "[[";
  const char* close = colour ? "\x1b[0m" : "]]";
  std::string out;
  for (size_t i = 0; i < ex.ids.size();) {
    size_t j = i;
    while (j < ex.ids.size() && ex.target[j] == ex.target[i]) ++j;
    const std::string text = tok.decode(std::vector<int32_t>(ex.ids.begin() + i, ex.ids.begin() + j));
    absl::StrAppend(&out, ex.target[i] ? open : "", text, ex.target[i] ? close : "");
    i = j;
  }
  return out;
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
  // The model folder the tokenizer belongs to (for its chat template): the folder itself, the
  // folder of a tokenizer.json, or a .gguf file.
  const std::string tok_path = args->str("tokenizer");
  const std::string parent = std::filesystem::path(tok_path).parent_path().string();
  const std::string model = !tok_path.ends_with(".json") ? tok_path : parent.empty() ? std::string(".") : parent;
  DataOptions opt;
  std::string note;
  opt.chat_template = training_chat_template(model, args->str("chat-template"), &note);
  DataStats stats;
  auto examples = load_jsonl(args->str("input"), *tok, opt, &stats);
  if (!examples.ok()) return fail(std::string(examples.status().message()));
  if (!note.empty() && stats.conversations > 0) std::fprintf(stderr, "loom tokenize: %s\n", note.c_str());
  if (!args->flag("show")) {
    for (const Example& ex : *examples) print_ids(ex.ids);
    return 0;
  }
  const bool colour = isatty(fileno(stdout));
  for (size_t k = 0; k < examples->size(); ++k) {
    const Example& ex = (*examples)[k];
    int64_t targets = 0;
    for (uint8_t t : ex.target) targets += t;
    std::string text = show(ex, *tok, colour);
    if (text.empty() || text.back() != '\n') text += '\n';
    std::printf("--- record %zu: %zu tokens, %lld trained ---\n%s", k + 1, ex.ids.size(), static_cast<long long>(targets),
                text.c_str());
  }
  return 0;
}

}  // namespace loom::cli
