// `loom bench-cpu --model DIR|FILE.gguf`: the CPU LoRA training step (the trainer's: fused lm_head +
// loss, backward, clipping-free AdamW over the adapters) timed on random tokens, its achieved
// GFLOP/s printed beside Eigen's sgemm rate on the same machine and threads, so a slow step can be
// told apart from a slow machine.
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "autograd/tape.h"
#include "models/lora.h"
#include "optim/adamw.h"
#include "tools/cli_args.h"
#include "tools/commands.h"

namespace loom::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"model", false, "Hugging Face model folder or .gguf file (omit for the sgemm rate alone)", ""},
    {"batch-size", false, "rows per step", "4"},
    {"seq-len", false, "tokens per row", "256"},
    {"lora-r", false, "LoRA rank (all seven projections)", "16"},
    {"steps", false, "timed steps (after one warm-up step)", "3"},
    {"help", true, "show this help", ""},
};

int fail(const absl::Status& s) {
  std::fprintf(stderr, "loom bench-cpu: %s\n", std::string(s.message()).c_str());
  return 1;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
// CPU seconds used by every thread of this process: on a machine others are also using, CPU time /
// threads is what the step would take with the cores to itself.
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Best-of-5 rate of C = A B (f32, row-major as Loom stores activations and weights) in GFLOP/s:
// wall-clock with Eigen's own threads, and per CPU second on one thread (which a machine shared
// with other work does not distort) times the thread count.
struct SgemmRate {
  double wall, cpu_per_thread_times_threads;
};
SgemmRate sgemm_gflops(int64_t m, int64_t k, int64_t n) {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Mat a = Mat::Random(m, k), b = Mat::Random(k, n), c(m, n);
  double best = 1e30, best_cpu = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t = Clock::now();
    c.noalias() = a * b;
    best = std::min(best, seconds_since(t));
  }
  const int threads = omp_get_max_threads();
  Eigen::setNbThreads(1);
  for (int rep = 0; rep < 5; ++rep) {
    const double t = cpu_seconds();
    c.noalias() = a * b;
    best_cpu = std::min(best_cpu, cpu_seconds() - t);
  }
  Eigen::setNbThreads(threads);
  const double flops = 2.0 * m * k * n;
  return {flops / best * 1e-9, flops / best_cpu * 1e-9 * threads};
}

void print_sgemm(const char* label, int64_t m, int64_t k, int64_t n) {
  const SgemmRate r = sgemm_gflops(m, k, n);
  std::printf("Eigen sgemm %-24s %7.1f GFLOP/s wall, %7.1f GFLOP/s = 1 thread per CPU second x %d\n", label, r.wall,
              r.cpu_per_thread_times_threads, omp_get_max_threads());
}

// Floating-point operations of one LoRA training step over `tokens` tokens in rows of `seq`:
// forward matmuls 2 P per token (P = the frozen projections and lm_head), backward 2 P for the input
// gradients (the frozen weights get none), the adapters 6 r (in + out) per token per projection
// (forward, input and weight gradients), causal attention 2 S d_q per token per layer forward (QK^T
// and PV over S/2 keys on average) and twice that backward.
double step_flops(const ModelConfig& c, int64_t tokens, int64_t seq, int64_t r) {
  const double h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size;
  const double proj = h * q + 2 * h * kv + q * h + 3 * h * f;  // per layer
  const double frozen = c.num_hidden_layers * proj + h * c.vocab_size;
  const double lora_io = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + f) + (f + h);  // in + out per projection
  const double lora = c.num_hidden_layers * 6.0 * r * lora_io;
  const double attn = c.num_hidden_layers * 2.0 * seq * q * 3;
  return tokens * (4 * frozen + lora + attn);
}

}  // namespace

int run_bench_cpu(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, kFlags);
  if (!args.ok()) return fail(args.status());
  if (args->flag("help")) {
    std::fputs(usage("bench-cpu", kFlags).c_str(), stdout);
    return 0;
  }
  auto batch = args->integer("batch-size");
  auto seq = args->integer("seq-len");
  auto r = args->integer("lora-r");
  auto steps = args->integer("steps");
  for (const absl::Status& s : {batch.status(), seq.status(), r.status(), steps.status()})
    if (!s.ok()) return fail(s);
  if (*batch < 1 || *seq < 2 || *r < 1 || *steps < 1)
    return fail(absl::InvalidArgumentError("need --batch-size >= 1, --seq-len >= 2, --lora-r >= 1, --steps >= 1"));

  std::printf("threads: %d (OMP_NUM_THREADS)\n", omp_get_max_threads());
  print_sgemm("1024x1024x1024", 1024, 1024, 1024);
  if (!args->has("model")) return 0;

  auto model = CausalLM::load(args->str("model"), {DType::f32, Device::cpu()});
  if (!model.ok()) return fail(model.status());
  const ModelConfig& c = (*model)->config();
  if (*seq > c.max_position_embeddings)
    return fail(absl::InvalidArgumentError(absl::StrCat("--seq-len ", *seq, " exceeds the model's max_position_embeddings ",
                                                        c.max_position_embeddings, " (", args->str("model"), "/config.json)")));
  const int64_t tokens = *batch * *seq;
  const std::string shape = absl::StrCat(tokens, "x", c.hidden_size, "x", c.intermediate_size, " (MLP up)");
  print_sgemm(shape.c_str(), tokens, c.hidden_size, c.intermediate_size);
  LoraConfig lc;
  lc.r = *r;
  lc.alpha = static_cast<float>(*r);
  if (absl::Status s = add_lora(**model, lc, 1); !s.ok()) return fail(s);
  optim::Optimizer adamw(optim::make_adamw({}));
  const int group = adamw.add_group({"lora", 1.f, 0.f});
  for (auto& [name, v] : lora_parameters(**model)) adamw.add_param(name, *v, group);
  std::vector<int32_t> ids(tokens);
  uint64_t x = 88172645463325252ull;
  for (int32_t& id : ids) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    id = static_cast<int32_t>(x % static_cast<uint64_t>(c.vocab_size));
  }
  const Tensor input = Tensor::from_ints(ids, {*batch, *seq});
  const double flops = step_flops(c, tokens, *seq, *r);
  double total = 0, total_cpu = 0;
  for (int64_t step = 0; step <= *steps; ++step) {
    const auto t = Clock::now();
    const double c0 = cpu_seconds();
    ag::Variable loss = (*model)->loss(input, input);
    ag::backward(loss);
    adamw.step(1e-4f);
    adamw.zero_grad();
    const double dt = seconds_since(t), cpu = cpu_seconds() - c0;
    if (step > 0) total += dt, total_cpu += cpu;
    std::printf("step %lld%s: %.2f s (%.2f CPU s), loss %.4f, %.1f tokens/s, %.1f GFLOP/s\n", static_cast<long long>(step),
                step == 0 ? " (warm-up)" : "", dt, cpu, loss.value().item(), tokens / dt, flops / dt * 1e-9);
  }
  const double per_step = total / static_cast<double>(*steps);
  const double threads = omp_get_max_threads(), per_step_cpu = total_cpu / static_cast<double>(*steps) / threads;
  std::printf("LoRA r%lld training step, batch %lld x %lld, f32 (%.2f GFLOP per step):\n"
              "  wall:     %.2f s/step, %.1f tokens/s, %.1f GFLOP/s\n"
              "  CPU / %d: %.2f s/step, %.1f tokens/s, %.1f GFLOP/s (the cores to itself; wall > this when "
              "others use them)\n",
              static_cast<long long>(*r), static_cast<long long>(*batch), static_cast<long long>(*seq), flops * 1e-9,
              per_step, tokens / per_step, flops / per_step * 1e-9, static_cast<int>(threads), per_step_cpu,
              tokens / per_step_cpu, flops / per_step_cpu * 1e-9);
  return 0;
}

}  // namespace loom::cli
