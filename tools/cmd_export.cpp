// `loom export --model DIR|FILE.gguf [--adapter DIR] --out FILE.gguf --type f16|bf16|q8_0`: the model
// with its LoRA adapter folded in (as `loom merge`), written as a llama.cpp GGUF file with the
// tokenizer, chat template and the source's provenance (general.*), which llama.cpp and Ollama load.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "models/gguf_export.h"
#include "models/gguf_provenance.h"
#include "models/lora.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "tools/outputs.h"
#include "train/gguf_tokenizer_export.h"

namespace loom::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"model", false, "base model: Hugging Face folder or .gguf file", ""},
    {"adapter", false, "PEFT LoRA adapter folder to fold in", ""},
    {"out", false, "the .gguf file to write", ""},
    {"type", false, "f16, bf16 or q8_0 for the matrices (norms and biases stay f32)", "f16"},
    {"name", false, "general.name (default: the source's name; with --adapter, followed by the adapter folder's name)", ""},
    {"overwrite", true, kOverwriteHelp, ""},
    {"help", true, "show this help", ""},
};

int fail(const absl::Status& s) {
  std::fprintf(stderr, "loom export: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int run_export(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, kFlags);
  if (!args.ok()) return fail(args.status());
  if (args->flag("help")) {
    std::fputs(usage("export", kFlags).c_str(), stdout);
    return 0;
  }
  for (const char* required : {"model", "out"})
    if (!args->has(required)) return fail(absl::InvalidArgumentError(absl::StrCat("--", required, " is required")));
  const std::string type_name = args->str("type");
  GgmlType type;
  if (type_name == "f16") type = GgmlType::F16;
  else if (type_name == "bf16") type = GgmlType::BF16;
  else if (type_name == "q8_0") type = GgmlType::Q8_0;
  else return fail(absl::InvalidArgumentError(absl::StrCat("--type ", type_name, ": expected f16, bf16 or q8_0")));
  const std::string src = args->str("model"), out = args->str("out");
  if (!out.ends_with(".gguf")) return fail(absl::InvalidArgumentError(absl::StrCat("--out ", out, ": expected a .gguf file name")));
  if (absl::Status s = check_not_over_inputs("--out", out, {{"--model", src}}, /*inside=*/false); !s.ok()) return fail(s);
  if (absl::Status s = check_out_file("--out", out, args->flag("overwrite")); !s.ok()) return fail(s);
  // The source's license, organization, languages... (and, with an adapter, the fine-tune's name).
  auto provenance = source_provenance(src);
  if (!provenance.ok()) return fail(provenance.status());
  if (args->has("adapter")) *provenance = finetune_provenance(*provenance, args->str("adapter"));
  if (args->has("name")) provenance->name = args->str("name");

  // f32 weights so the merge adds B A to unrounded weights; the file rounds once.
  auto model = CausalLM::load(src, {DType::f32, Device::cpu()});
  if (!model.ok()) return fail(model.status());
  if (args->has("adapter")) {
    auto lc = load_adapter(**model, args->str("adapter"));
    if (!lc.ok()) return fail(lc.status());
    merge_lora(**model);
  }
  if (const std::string warning = gguf_export_warning((*model)->config()); !warning.empty())
    std::fprintf(stderr, "loom export: warning: %s\n", warning.c_str());
  GgufWriter w;
  if (absl::Status s = add_gguf_model(**model, type, provenance->name, w); !s.ok()) return fail(s);
  add_gguf_provenance(*provenance, w);
  auto arch = gguf_architecture(*(*model)->config().family);
  if (!arch.ok()) return fail(arch.status());
  if (absl::Status s = add_gguf_tokenizer(src, (*model)->config().vocab_size, *arch, w); !s.ok()) return fail(s);
  if (absl::Status s = w.write(out); !s.ok()) return fail(s);
  std::printf("loom export: %s%s -> %s (%s, general.name \"%s\")\n", src.c_str(),
              args->has("adapter") ? absl::StrCat(" + ", args->str("adapter")).c_str() : "", out.c_str(), type_name.c_str(),
              provenance->name.c_str());
  return 0;
}

}  // namespace loom::cli
