// `loom tokenize`: encodes text with a Hugging Face tokenizer.json and prints the token ids as JSON,
// one array per input: --text, or each record of a JSONL file rendered exactly as `loom train` does
// ({"messages"} with the model's chat template, {"prompt","completion"}, {"text"}).
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
  // The model folder the tokenizer belongs to (for its chat template): the folder itself, the
  // folder of a tokenizer.json, or a .gguf file.
  const std::string tok_path = args->str("tokenizer");
  const std::string parent = std::filesystem::path(tok_path).parent_path().string();
  const std::string model = !tok_path.ends_with(".json") ? tok_path : parent.empty() ? std::string(".") : parent;
  DataOptions opt;
  std::string note;
  opt.chat_template = training_chat_template(model, args->str("chat-template"), &note);
  if (!note.empty()) std::fprintf(stderr, "loom tokenize: %s\n", note.c_str());
  auto examples = load_jsonl(args->str("input"), *tok, opt, nullptr);
  if (!examples.ok()) return fail(std::string(examples.status().message()));
  for (const Example& ex : *examples) print_ids(ex.ids);
  return 0;
}

}  // namespace loom::cli
