// `loom generate`: samples a continuation of a prompt from a Hugging Face model (optionally with a
// PEFT LoRA adapter) with a KV cache, streaming the text as it is produced.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "models/generate.h"
#include "models/lora.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "text/tokenizer.h"

namespace loom::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"model", false, "Hugging Face model folder (config.json, safetensors, tokenizer.json)", ""},
    {"adapter", false, "PEFT LoRA adapter folder to apply", ""},
    {"prompt", false, "the text to continue", ""},
    {"max-new-tokens", false, "tokens to generate at most", "128"},
    {"temperature", false, "sampling temperature (0 = greedy)", "0.7"},
    {"top-p", false, "nucleus sampling mass", "0.9"},
    {"seed", false, "sampling seed", "0"},
    {"device", false, "cpu, cuda or cuda:N", "cpu"},
    {"dtype", false, "f32 or bf16", "bf16"},
    {"help", true, "show this help", ""},
};

int fail(const absl::Status& s) {
  std::fprintf(stderr, "loom generate: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int run_generate(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, kFlags);
  if (!args.ok()) return fail(args.status());
  if (args->flag("help")) {
    std::fputs(usage("generate", kFlags).c_str(), stdout);
    return 0;
  }
  for (const char* required : {"model", "prompt"})
    if (!args->has(required)) return fail(absl::InvalidArgumentError(absl::StrCat("--", required, " is required")));
  auto device = parse_device(args->str("device"));
  if (!device.ok()) return fail(device.status());
  if (device->is_cuda() && device->index >= cuda_device_count())
    return fail(absl::InvalidArgumentError(absl::StrCat("--device ", device->str(), ": no such CUDA device")));
  const std::string dt = args->str("dtype");
  if (dt != "f32" && dt != "bf16") return fail(absl::InvalidArgumentError("--dtype must be f32 or bf16"));
  GenerateOptions opt;
  auto n = args->integer("max-new-tokens");
  auto temp = args->number("temperature");
  auto top_p = args->number("top-p");
  auto seed = args->integer("seed");
  for (const absl::Status& s : {n.status(), temp.status(), top_p.status(), seed.status()})
    if (!s.ok()) return fail(s);
  if (*n < 1 || *temp < 0 || *top_p <= 0 || *top_p > 1)
    return fail(absl::InvalidArgumentError("need --max-new-tokens >= 1, --temperature >= 0 and 0 < --top-p <= 1"));
  opt.max_new_tokens = *n;
  opt.temperature = static_cast<float>(*temp);
  opt.top_p = static_cast<float>(*top_p);
  opt.seed = static_cast<uint64_t>(*seed);

  auto tokenizer = Tokenizer::load(args->str("model"));
  if (!tokenizer.ok()) return fail(tokenizer.status());
  auto model = CausalLM::load(args->str("model"), {*dtype_from_name(dt), *device});
  if (!model.ok()) return fail(model.status());
  if (args->has("adapter"))
    if (auto lc = load_adapter(**model, args->str("adapter")); !lc.ok()) return fail(lc.status());
  for (int64_t id : (*model)->config().eos_token_ids) opt.stop_ids.push_back(static_cast<int32_t>(id));
  if (auto eos = tokenizer->eos_id()) opt.stop_ids.push_back(*eos);
  const std::vector<int32_t> prompt = tokenizer->encode(args->str("prompt"), /*add_special_tokens=*/true);
  if (prompt.empty()) return fail(absl::InvalidArgumentError("the prompt encodes to no tokens"));
  if (static_cast<int64_t>(prompt.size()) >= (*model)->config().max_position_embeddings)
    return fail(absl::OutOfRangeError(absl::StrCat("the prompt is ", prompt.size(), " tokens; the model's ",
                                                   "max_position_embeddings is ", (*model)->config().max_position_embeddings)));
  std::fputs(args->str("prompt").c_str(), stdout);
  std::fflush(stdout);
  std::vector<int32_t> produced;
  std::string shown;
  generate(**model, prompt, opt, [&](int32_t id) {
    produced.push_back(id);
    const std::string text = tokenizer->decode(produced, /*skip_special_tokens=*/true);
    // Print only what is new, and only once a multi-byte character is complete.
    if (text.size() > shown.size() && (static_cast<unsigned char>(text.back()) & 0xC0) != 0xC0) {
      std::fputs(text.c_str() + shown.size(), stdout);
      std::fflush(stdout);
      shown = text;
    }
  });
  std::printf("\n");
  return 0;
}

}  // namespace loom::cli
