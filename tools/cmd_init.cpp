// `loom init`: writes a freshly initialised Hugging Face model (N(0, 0.02) weights, unit norms)
// from a folder holding config.json (and tokenizer files, copied along): a base for training from
// scratch and for the demo, with nothing downloaded.
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "models/lora.h"
#include "text/tokenizer.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "tools/outputs.h"

namespace loom::cli {
namespace {
const std::vector<FlagSpec> kFlags = {
    {"from", false, "folder with config.json (tokenizer.json etc. are copied too)", ""},
    {"out", false, "output Hugging Face folder (config.json, model.safetensors in bf16, tokenizer files)", ""},
    {"seed", false, "initialisation seed", "0"},
    {"overwrite", true, kOverwriteHelp, ""},
    {"help", true, "show this help", ""},
};
int fail(const absl::Status& s) {
  std::fprintf(stderr, "loom init: %s\n", std::string(s.message()).c_str());
  return 1;
}
}  // namespace

int run_init(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, kFlags);
  if (!args.ok()) return fail(args.status());
  if (args->flag("help")) {
    std::fputs(usage("init", kFlags).c_str(), stdout);
    return 0;
  }
  for (const char* required : {"from", "out"})
    if (!args->has(required)) return fail(absl::InvalidArgumentError(absl::StrCat("--", required, " is required")));
  // --out may be --from's folder itself (with --overwrite): the model is built beside it first.
  if (absl::Status s = check_out_folder("--out", args->str("out"), args->flag("overwrite")); !s.ok()) return fail(s);
  auto seed = args->integer("seed");
  if (!seed.ok()) return fail(seed.status());
  auto model = CausalLM::init_random(args->str("from"), {DType::f32, Device::cpu()}, static_cast<uint64_t>(*seed));
  if (!model.ok()) return fail(model.status());
  auto staged = StagedFolder::create(args->str("out"));
  if (!staged.ok()) return fail(staged.status());
  if (absl::Status s = save_pretrained(**model, staged->dir()); !s.ok()) return fail(s);
  if (absl::Status s = staged->commit(); !s.ok()) return fail(s);
  // A tokenizer with more tokens than the model has embedding rows: train and generate refuse it.
  if (std::filesystem::exists(std::filesystem::path(args->str("from")) / "tokenizer.json"))
    if (auto tok = Tokenizer::load(args->str("from")); tok.ok())
      if (absl::Status s = tok->fits_vocab((*model)->config().vocab_size); !s.ok())
        std::fprintf(stderr, "loom init: warning: %s; loom train and loom generate will refuse this model\n",
                     std::string(s.message()).c_str());
  int64_t params = 0;
  for (const auto& [name, v] : std::as_const(**model).named_weights()) params += v->value().numel();
  // save_pretrained stores bf16 (config.json says so): say that, not the f32 it was initialised in.
  std::printf("loom init: %s, %.2f M parameters, written as bf16 -> %s\n", (*model)->config().summary().c_str(),
              static_cast<double>(params) / 1e6, args->str("out").c_str());
  return 0;
}

}  // namespace loom::cli
