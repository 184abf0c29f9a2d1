// `loom demo`: builds ToyLlama from the foundation's ops, trains it for a few AdamW steps on a
// fixed, learnable token pattern, and prints the loss falling. Needs no files or network.
#include <chrono>
#include <cstdio>
#include <vector>

#include "engine/device.h"
#include "models/toy_llama.h"
#include "tools/cli_args.h"
#include "tools/commands.h"

namespace loom::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"device", false, "cpu, cuda or cuda:N", "cpu"},
    {"steps", false, "optimizer steps", "30"},
    {"lr", false, "AdamW learning rate", "0.01"},
    {"batch-size", false, "sequences per step", "4"},
    {"seq-len", false, "tokens per sequence", "32"},
    {"bf16", true, "compute in bf16 (f32 master weights)", ""},
    {"seed", false, "weight initialisation seed", "0"},
    {"help", true, "show this help", ""},
};

int fail(const absl::Status& s) {
  std::fprintf(stderr, "loom demo: %s\n", std::string(s.message()).c_str());
  return 2;
}

}  // namespace

int run_demo(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, kFlags);
  if (!args.ok()) return fail(args.status());
  if (args->flag("help")) {
    std::fputs(usage("demo", kFlags).c_str(), stdout);
    return 0;
  }
  auto device = parse_device(args->str("device"));
  if (!device.ok()) return fail(device.status());
  if (device->is_cuda() && device->index >= cuda_device_count())
    return fail(absl::InvalidArgumentError("--device " + device->str() + ": no such CUDA device"));
  auto steps = args->integer("steps");
  auto batch = args->integer("batch-size");
  auto seq = args->integer("seq-len");
  auto lr = args->number("lr");
  auto seed = args->integer("seed");
  for (const absl::Status& s : {steps.status(), batch.status(), seq.status(), lr.status(), seed.status()})
    if (!s.ok()) return fail(s);
  if (*steps < 1 || *batch < 1 || *seq < 2) return fail(absl::InvalidArgumentError("--steps, --batch-size must be >= 1 and --seq-len >= 2"));

  ToyLlamaConfig config;
  config.seed = static_cast<uint64_t>(*seed);
  const DType compute = args->flag("bf16") ? DType::bf16 : DType::f32;
  ToyLlama model(config, *device, compute);

  // A learnable stream: each sequence counts upward by a per-sequence stride modulo the vocabulary.
  std::vector<int32_t> ids, targets;
  for (int64_t b = 0; b < *batch; ++b)
    for (int64_t s = 0; s < *seq; ++s) {
      ids.push_back(static_cast<int32_t>((b * 7 + s * (b + 1)) % config.vocab_size));
      targets.push_back(s + 1 < *seq ? static_cast<int32_t>((b * 7 + (s + 1) * (b + 1)) % config.vocab_size) : -100);
    }
  const Tensor ids_t = Tensor::from_ints(ids, {*batch, *seq}).to(*device);
  const Tensor targets_t = Tensor::from_ints(targets, {*batch, *seq}).to(*device);

  std::printf("loom demo: ToyLlama, %lld parameters, %s, %s compute, %lld x %lld tokens per step\n",
              static_cast<long long>(model.num_parameters()), device->str().c_str(), std::string(name(compute)).c_str(),
              static_cast<long long>(*batch), static_cast<long long>(*seq));
  AdamWParams p;
  p.lr = static_cast<float>(*lr);
  p.weight_decay = 0.0f;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 1; step <= *steps; ++step) {
    ag::Variable loss = model.loss(ids_t, targets_t);
    const float value = loss.value().item();
    ag::backward(loss);
    model.step(p);
    std::printf("step %3lld  loss %.4f\n", static_cast<long long>(step), value);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%lld steps in %.2f s (%.0f tokens/s)\n", static_cast<long long>(*steps), secs,
              static_cast<double>(*steps * *batch * *seq) / secs);
  return 0;
}

}  // namespace loom::cli
