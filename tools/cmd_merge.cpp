// `loom merge`: folds a PEFT LoRA adapter into its base model and writes a bf16 Hugging Face
// checkpoint that transformers loads.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "models/lora.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "tools/outputs.h"

namespace loom::cli {
namespace {
const std::vector<FlagSpec> kFlags = {
    {"model", false, "base model: Hugging Face folder or .gguf file", ""},
    {"adapter", false, "PEFT LoRA adapter folder", ""},
    {"out", false, "output Hugging Face folder (config.json + model.safetensors in bf16, tokenizer files)", ""},
    {"device", false, "cpu, cuda or cuda:N (where the merge is computed, in f32)", "cpu"},
    {"overwrite", true, kOverwriteHelp, ""},
    {"help", true, "show this help", ""},
};
int fail(const absl::Status& s) {
  std::fprintf(stderr, "loom merge: %s\n", std::string(s.message()).c_str());
  return 1;
}
}  // namespace

int run_merge(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, kFlags);
  if (!args.ok()) return fail(args.status());
  if (args->flag("help")) {
    std::fputs(usage("merge", kFlags).c_str(), stdout);
    return 0;
  }
  for (const char* required : {"model", "adapter", "out"})
    if (!args->has(required)) return fail(absl::InvalidArgumentError(absl::StrCat("--", required, " is required")));
  if (absl::Status s = check_not_over_inputs("--out", args->str("out"),
                                             {{"--model", args->str("model")}, {"--adapter", args->str("adapter")}},
                                             /*inside=*/false);
      !s.ok())
    return fail(s);
  if (absl::Status s = check_out_folder("--out", args->str("out"), args->flag("overwrite")); !s.ok()) return fail(s);
  auto device = parse_device(args->str("device"));
  if (!device.ok()) return fail(device.status());
  if (device->is_cuda() && device->index >= cuda_device_count())
    return fail(absl::InvalidArgumentError(absl::StrCat("--device ", device->str(), ": no such CUDA device")));
  // f32 weights so the merge adds B A to unrounded weights; the export rounds once to bf16.
  auto model = CausalLM::load(args->str("model"), {DType::f32, *device});
  if (!model.ok()) return fail(model.status());
  auto lc = load_adapter(**model, args->str("adapter"));
  if (!lc.ok()) return fail(lc.status());
  merge_lora(**model);
  auto staged = StagedFolder::create(args->str("out"));
  if (!staged.ok()) return fail(staged.status());
  if (absl::Status s = save_pretrained(**model, staged->dir()); !s.ok()) return fail(s);
  if (absl::Status s = staged->commit(); !s.ok()) return fail(s);
  std::printf("loom merge: %s + %s -> %s (bf16)\n", args->str("model").c_str(), args->str("adapter").c_str(),
              args->str("out").c_str());
  return 0;
}

}  // namespace loom::cli
