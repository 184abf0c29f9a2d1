// `loom doctor`: what a run will find on this machine, one line per check, then a verdict; the exit
// code is 1 when a check failed. The build (version, commit, CUDA and its architectures, the ISA it
// was compiled for), the CPU (model, cores, ISA, OpenMP), each GPU (capability, memory, driver and
// runtime, whether Loom's Hopper kernels run on it, peer access), NCCL and MPI, how this process was
// launched, the pinned-memory limit and the free disk where runs write; then a self-test of a few
// seconds on every device: a GEMM, attention forward and backward, a LoRA product forward and
// backward and one training step of a tiny model, each against a CPU reference. --json for scripts.
#include <omp.h>
#include <sys/resource.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "dist/launch_env.h"
#include "dist/versions.h"
#include "engine/ops.h"
#include "engine/system_info.h"
#include "engine/memory.h"
#include "models/causal_lm.h"
#include "models/toy_llama.h"
#include "train/checkpointing_plan.h"
#include "loom_git_commit.h"  // generated at build time: LOOM_GIT_COMMIT
#include "train/device_plan.h"
#include "train/run_placement.h"
#include "nlohmann/json.hpp"
#include "tools/cli_args.h"
#include "tools/commands.h"

namespace loom::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"out", false, "the folder runs will write to (its free disk is checked)", "."},
    {"model", false, "a Hugging Face model folder: estimate a training run's peak memory in each checkpointing mode", ""},
    {"device", false, "for --model: the device the run would use (cpu, cuda, cuda:N)", "cuda when there is a GPU, else cpu"},
    {"seq-len", false, "for --model: tokens a row", "2048"},
    {"batch-size", false, "for --model: rows a micro-batch", "1"},
    {"lora-r", false, "for --model: LoRA rank", "16"},
    {"qlora", true, "for --model: the decoder weights in NF4", ""},
    {"full", true, "for --model: full fine-tuning (16 bytes of state a weight)", ""},
    {"checkpointing", false, "for --model: the one mode to estimate (none, recompute, offload)", "every mode"},
    {"dist", false, "for --model: ddp or zero2 over --ranks processes (zero2 shards the optimizer's 12 bytes of a "
     "trainable weight's 16)", ""},
    {"ranks", false, "for --model with --dist: the processes (default: the launcher's world size, else 1)", ""},
    {"offload-optimizer", true, "for --model: the optimizer's state (12 bytes of a trainable weight's 16) in host memory",
     ""},
    {"device-map", false, "for --model: the plan loom train --device-map would make (auto, balanced, sequential, FILE)",
     ""},
    {"max-memory", false, "for --model with --device-map: caps as cuda:0=20GiB,cpu=100GiB", ""},
    {"json", true, "print the checks as one JSON object", ""},
    {"no-self-test", true, "skip the self-test of the devices", ""},
    {"help", true, "show this help", ""},
};

enum class Status { kOk, kInfo, kWarn, kFail };
const char* status_name(Status s) {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kInfo: return "info";
    case Status::kWarn: return "warn";
    case Status::kFail: return "FAIL";
  }
  return "";
}

struct Check {
  std::string name, detail;
  Status status;
};

std::string gib(int64_t b) {
  return b < (1LL << 30) ? absl::StrFormat("%.0f MiB", static_cast<double>(b) / (1LL << 20))
                         : absl::StrFormat("%.1f GiB", static_cast<double>(b) / (1LL << 30));
}

Tensor random(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape, DType::f64);
  ops::uniform_(t, seed, 0, -1.f, 1.f);
  return t;
}

double rel_err(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = got.to(Device::cpu()).to(DType::f64).to_doubles(), b = want.to(DType::f64).to_doubles();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return a.size() != b.size() ? INFINITY : std::sqrt(num / std::max(den, 1e-300));
}

// One self-test: the device's result against the f64 CPU reference, within `tol` (relative L2).
Check compare(const std::string& name, Device d, const std::function<std::vector<Tensor>(Device, DType)>& run, double tol) {
  const DType dt = d.is_cuda() ? DType::bf16 : DType::f32;
  try {
    const std::vector<Tensor> got = run(d, dt), want = run(Device::cpu(), DType::f64);
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, rel_err(got[i], want[i]));
    const std::string detail = absl::StrFormat("%s, %s: largest relative error %.2g (within %.0g)", d.str(),
                                               std::string(loom::name(dt)), worst, tol);
    return {name, detail, worst <= tol ? Status::kOk : Status::kFail};
  } catch (const std::exception& e) {
    return {name, absl::StrCat(d.str(), ": ", e.what()), Status::kFail};
  }
}

std::vector<Check> self_test(Device d) {
  std::vector<Check> out;
  const double tol = d.is_cuda() ? 2e-2 : 1e-5;  // bf16 on a GPU, f32 on the CPU
  out.push_back(compare("self-test: GEMM", d, [](Device dev, DType dt) {
    const Tensor a = random({96, 64}, 1).to(dt).to(dev), b = random({48, 64}, 2).to(dt).to(dev);
    return std::vector<Tensor>{ops::matmul(a, b, false, true)};
  }, tol));
  out.push_back(compare("self-test: attention forward and backward", d, [](Device dev, DType dt) {
    const Tensor q = random({2, 32, 4, 16}, 3).to(dt).to(dev), k = random({2, 32, 2, 16}, 4).to(dt).to(dev),
                 v = random({2, 32, 2, 16}, 5).to(dt).to(dev), dout = random({2, 32, 4, 16}, 6).to(dt).to(dev);
    ops::AttentionOptions opt;
    const ops::AttentionOut o = ops::attention(q, k, v, opt);
    const ops::AttentionGrads g = ops::attention_backward(q, k, v, o.out, dout, o.lse, opt);
    return std::vector<Tensor>{o.out, g.dq, g.dk, g.dv};
  }, tol));
  out.push_back(compare("self-test: LoRA product forward and backward", d, [](Device dev, DType dt) {
    ag::Variable x(random({8, 32}, 7).to(dt).to(dev), true), w(random({24, 32}, 8).to(dt).to(dev), false);
    ag::Variable a(random({4, 32}, 9).to(dt == DType::f64 ? DType::f64 : DType::f32).to(dev), true);
    ag::Variable b(random({24, 4}, 10).to(dt == DType::f64 ? DType::f64 : DType::f32).to(dev), true);
    ag::Variable y = ag::lora_linear(x, w, a, b, ag::LoraArgs{0.5f});
    ag::backward(y, random({8, 24}, 11).to(dt).to(dev));
    return std::vector<Tensor>{y.value(), x.grad(), a.grad(), b.grad()};
  }, tol));
  // One AdamW step of a tiny Llama: the loss before and after, on the device and on the CPU in f32.
  try {
    auto step = [](Device dev, DType dt) {
      ToyLlama m(ToyLlamaConfig{}, dev, dt);
      std::vector<int32_t> ids(2 * 16), targets(2 * 16);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7) % 64), targets[i] = static_cast<int32_t>((i * 7 + 7) % 64);
      const Tensor ti = Tensor::from_ints(ids, {2, 16}).to(dev), tt = Tensor::from_ints(targets, {2, 16}).to(dev);
      ag::Variable l0 = m.loss(ti, tt);
      const double before = l0.value().to(Device::cpu()).to(DType::f64).to_doubles()[0];
      ag::backward(l0);
      m.step(AdamWParams{1e-2f});
      const double after = m.loss(ti, tt).value().to(Device::cpu()).to(DType::f64).to_doubles()[0];
      return std::pair<double, double>{before, after};
    };
    const auto [b0, a0] = step(d, d.is_cuda() ? DType::bf16 : DType::f32);
    const auto [b1, a1] = step(Device::cpu(), DType::f64);
    const bool ok = a0 < b0 && std::abs(b0 - b1) <= tol * std::abs(b1) && std::abs(a0 - a1) <= tol * std::abs(a1);
    out.push_back({"self-test: training step", absl::StrFormat("%s: loss %.5f -> %.5f (CPU f64: %.5f -> %.5f)", d.str(),
                                                                b0, a0, b1, a1),
                   ok ? Status::kOk : Status::kFail});
  } catch (const std::exception& e) {
    out.push_back({"self-test: training step", absl::StrCat(d.str(), ": ", e.what()), Status::kFail});
  }
  return out;
}

std::vector<Check> machine_checks(const std::string& out_dir) {
  std::vector<Check> c;
  const CpuInfo cpu = cpu_info();
  c.push_back({"build", absl::StrCat("loom ", LOOM_VERSION, " (", LOOM_GIT_COMMIT, "), CUDA ",
                                     built_with_cuda() ? absl::StrCat("on (architectures ", LOOM_CUDA_ARCHS, ")") : "off",
                                     ", compiled for ", cpu.built_for.empty() ? "baseline x86-64" : absl::StrJoin(cpu.built_for, " ")),
               Status::kInfo});
  std::vector<std::string> missing;
  for (const std::string& s : cpu.built_for)
    if (std::find(cpu.isa.begin(), cpu.isa.end(), s) == cpu.isa.end()) missing.push_back(s);
  c.push_back({"cpu", absl::StrCat(cpu.model.empty() ? "unknown model" : cpu.model, ", ", cpu.logical_cpus,
                                   " logical CPUs, ISA ", cpu.isa.empty() ? "baseline" : absl::StrJoin(cpu.isa, " "),
                                   missing.empty() ? "" : absl::StrCat("; the build needs ", absl::StrJoin(missing, " "),
                                                                       " which this CPU lacks")),
               missing.empty() ? Status::kOk : Status::kFail});
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  c.push_back({"openmp", absl::StrCat(omp_get_max_threads(), " threads (OMP_NUM_THREADS ",
                                      std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "unset",
                                      "), wait policy ", wait ? wait : "default"),
               Status::kInfo});
  const std::vector<GpuInfo> gpus = gpu_info();
  if (!built_with_cuda()) {
    c.push_back({"gpu", "this build has no CUDA (LOOM_CUDA=OFF): training runs on the CPU", Status::kInfo});
  } else if (gpus.empty()) {
    c.push_back({"gpu", absl::StrCat("no GPU visible (driver ", cuda_driver_version(), "): training runs on the CPU"),
                 Status::kWarn});
  }
  const std::string archs = LOOM_CUDA_ARCHS;
  for (const GpuInfo& g : gpus) {
    const bool hopper = g.major == 9 && g.minor == 0 && archs.find("90a") != std::string::npos;
    c.push_back({absl::StrCat("gpu ", g.index),
                 absl::StrFormat("%s, compute capability %d.%d, %s free of %s, driver %d, runtime %d, Hopper kernels %s, "
                                 "peer access to %s",
                                 g.name, g.major, g.minor, gib(g.free_bytes), gib(g.total_bytes), cuda_driver_version(),
                                 cuda_runtime_version(), hopper ? "yes" : "no (the portable kernels run)",
                                 g.peers.empty() ? "none" : absl::StrJoin(g.peers, ", ")),
                 Status::kOk});
  }
  if (built_with_cuda() && !gpus.empty()) {
    const absl::Status s = nccl_world_of_one(0);
    c.push_back({"nccl", absl::StrCat(nccl_version(), s.ok() ? ", a communicator of one rank started on GPU 0" : absl::StrCat(": ", s.message())),
                 s.ok() ? Status::kOk : Status::kFail});
  }
  auto launch = detect_launch_env();
  c.push_back({"mpi", absl::StrCat(mpi_library_version(), "; ",
                                   launch.ok() ? (launch->world_size > 1
                                                      ? absl::StrCat("started by ", launch->launcher, ": rank ", launch->rank, " of ",
                                                                     launch->world_size, ", local rank ", launch->local_rank)
                                                      : std::string("not started by a launcher (one process)"))
                                               : std::string(launch.status().message())),
               launch.ok() ? Status::kOk : Status::kFail});
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0)
    c.push_back({"pinned memory", lim.rlim_cur == RLIM_INFINITY ? "locked-memory limit: unlimited"
                                                                 : absl::StrCat("locked-memory limit: ", gib(static_cast<int64_t>(lim.rlim_cur)),
                                                                                " (CUDA's pinned buffers are not bound by it; NCCL over InfiniBand wants it unlimited)"),
                 Status::kInfo});
  struct statvfs fs {};
  if (statvfs(out_dir.c_str(), &fs) == 0) {
    const int64_t free_b = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
    c.push_back({"disk", absl::StrCat(gib(free_b), " free in ", out_dir, free_b < (int64_t{10} << 30) ? " (under 10 GiB: checkpoints of a large model may not fit)" : ""),
                 free_b < (int64_t{10} << 30) ? Status::kWarn : Status::kOk});
  } else {
    c.push_back({"disk", absl::StrCat(out_dir, ": cannot be read (", std::strerror(errno), ")"), Status::kFail});
  }
  return c;
}

// `--model`: the peak of a training step in each checkpointing mode, from the planner's sizes
// (train/device_plan.h) and the checkpointing plan's working memory, against what the device has.
int memory_estimate(const Args& args) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "loom doctor: %s\n", m.c_str());
    return 1;
  };
  auto config = ModelConfig::load(args.str("model"));
  if (!config.ok()) return fail(std::string(config.status().message()));
  const std::vector<GpuInfo> gpus = gpu_info();
  Device device = gpus.empty() ? Device::cpu() : Device::cuda(0);
  if (args.has("device")) {
    auto d = parse_device(args.str("device"));
    if (!d.ok()) return fail(std::string(d.status().message()));
    device = *d;
  }
  auto seq = args.integer("seq-len"), batch = args.integer("batch-size"), r = args.integer("lora-r");
  for (const auto* v : {&seq, &batch, &r})
    if (!v->ok()) return fail(std::string(v->status().message()));
  if (*seq < 1 || *batch < 1 || *r < 1) return fail("--seq-len, --batch-size and --lora-r must be at least 1");
  int64_t available = device_available_bytes(device);
  for (const GpuInfo& g : gpus)
    if (device.is_cuda() && g.index == device.index) available = g.free_bytes;
  std::vector<Checkpointing> modes = {Checkpointing::kNone, Checkpointing::kRecompute, Checkpointing::kOffload};
  if (args.has("checkpointing")) {
    auto m = parse_checkpointing(args.str("checkpointing"));
    if (!m.ok()) return fail(std::string(m.status().message()));
    modes = {*m};
  }
  // The trainable state's 16 bytes a weight: 4 of gradient stay on the device; the optimizer's 12
  // (f32 master or LoRA factor, two moments) are split over the ranks by zero2, or go to the host.
  int64_t ranks = 1;
  const std::string dist = args.str("dist");
  if (!dist.empty() && dist != "ddp" && dist != "zero2") return fail("--dist must be ddp or zero2, got '" + dist + "'");
  if (args.has("ranks")) {
    auto n = args.integer("ranks");
    if (!n.ok() || *n < 1) return fail("--ranks must be a positive integer");
    ranks = *n;
  } else if (const char* w = std::getenv("OMPI_COMM_WORLD_SIZE"); w && !dist.empty()) {
    ranks = std::max(1, std::atoi(w));
  }
  const bool offload_optimizer = args.has("offload-optimizer");
  auto state_on_device = [&](int64_t st) {
    const int64_t optimizer = st / 16 * 12;
    return st - optimizer + (offload_optimizer ? 0 : dist == "zero2" ? optimizer / ranks : optimizer);
  };
  PlanOptions o;
  o.qlora = args.has("qlora"), o.full = args.has("full"), o.lora_r = *r, o.tokens = *seq * *batch;
  o.weight_dtype = o.activation_dtype = device.is_cuda() ? DType::bf16 : DType::f32;
  std::printf("memory estimate: %s, %s, %lld x %lld tokens a micro-batch, on %s (%s available)\n",
              config->model_type.c_str(), o.full ? "full fine-tuning" : o.qlora ? "QLoRA" : "LoRA",
              static_cast<long long>(*batch), static_cast<long long>(*seq), device.str().c_str(), gib(available).c_str());
  if (!dist.empty() || offload_optimizer)
    std::printf("  trainable state on the device: gradients%s%s\n",
                offload_optimizer ? "; optimizer state in host memory" : "",
                dist == "zero2" && !offload_optimizer ? absl::StrFormat(" and 1/%d of the optimizer state (zero2)", ranks).c_str()
                                                      : "");
  std::printf("  %-10s %10s %16s %17s %12s %10s\n", "mode", "weights", "trainable state", "kept activations",
              "working", "total");
  bool any = false;
  for (Checkpointing mode : modes) {
    o.checkpointing = mode;
    int64_t w = 0, st = 0, act = 0;
    for (const PlanUnit& u : plan_units(*config, o)) w += u.weight_bytes, st += u.state_bytes, act += u.activation_bytes;
    st = state_on_device(st);
    // The rest of the mode's need (checkpointing_plan.h, the estimate loom train uses): the fused
    // loss's chunk and workspace, or a layer's activations while it recomputes, whichever is larger.
    const CheckpointingNeeds needs = estimate_checkpointing_needs(*config, o.tokens, o.activation_dtype, 0);
    const int64_t need = mode == Checkpointing::kNone        ? needs.none
                         : mode == Checkpointing::kRecompute ? needs.recompute
                                                             : needs.offload;
    // The embedding's output is kept apart from the layers' (plan_units counts it under its unit).
    const int64_t working = std::max<int64_t>(0, need - act);
    const int64_t total = w + st + std::max(act, need);
    const bool fits = total <= available;
    any = any || fits;
    std::printf("  %-10s %10s %16s %17s %12s %10s  %s\n", checkpointing_name(mode), gib(w).c_str(), gib(st).c_str(),
                gib(act).c_str(), gib(working).c_str(), gib(total).c_str(), fits ? "fits" : "does not fit");
  }
  if (args.has("device-map")) {  // the plan loom train would print, for this run's sizes
    if (o.full) return fail("--device-map trains LoRA or QLoRA adapters, not --full");
    Checkpointing mode;
    std::optional<Checkpointing> requested;
    if (modes.size() == 1) requested = modes[0];
    auto rp = plan_run_placement(*config, args.str("device-map"), args.str("max-memory"), o, requested, &mode);
    if (!rp.ok()) return fail(std::string(rp.status().message()));
    std::printf("with --device-map %s (--checkpointing %s):\n%s", args.str("device-map").c_str(), checkpointing_name(mode),
                rp->description.c_str());
    return 0;
  }
  if (!any) {
    std::vector<std::string> tries;
    if (!o.qlora && !o.full) tries.push_back("--qlora (weights in 4 bits)");
    if (modes.size() == 1 && modes[0] != Checkpointing::kOffload) tries.push_back("--checkpointing offload");
    if (o.full && !offload_optimizer) tries.push_back("--offload-optimizer (the optimizer's state in host memory)");
    if (o.full && dist != "zero2") tries.push_back("--dist zero2 over several GPUs (the optimizer's state split)");
    tries.push_back("a smaller --batch-size or --seq-len");
    std::printf("  %s fits: %s\n", modes.size() == 1 ? "this mode never" : "none of the modes",
                absl::StrJoin(tries, ", ").c_str());
  }
  return 0;
}

}  // namespace

int run_doctor(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, kFlags);
  if (!args.ok()) {
    std::fprintf(stderr, "loom doctor: %s\n", std::string(args.status().message()).c_str());
    return 2;
  }
  if (args->has("help")) {
    std::fputs(usage("doctor", kFlags).c_str(), stdout);
    return 0;
  }
  if (args->has("model")) return memory_estimate(*args);
  const bool json = args->has("json");
  std::vector<Check> checks = machine_checks(args->str("out"));
  if (!args->has("no-self-test")) {
    const auto t0 = std::chrono::steady_clock::now();
    for (Check& c : self_test(Device::cpu())) checks.push_back(std::move(c));
    for (const GpuInfo& g : gpu_info())
      for (Check& c : self_test(Device::cuda(g.index))) checks.push_back(std::move(c));
    checks.push_back({"self-test", absl::StrFormat("%.1f s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()),
                      Status::kInfo});
  }
  int failed = 0;
  for (const Check& c : checks) failed += c.status == Status::kFail;
  const std::string verdict = failed == 0 ? "All checks passed" : absl::StrCat(failed, " check(s) failed");
  if (json) {
    nlohmann::json j;
    for (const Check& c : checks) j["checks"].push_back({{"check", c.name}, {"status", status_name(c.status)}, {"detail", c.detail}});
    j["verdict"] = verdict;
    j["ok"] = failed == 0;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    for (const Check& c : checks) std::printf("[%4s] %-44s %s\n", status_name(c.status), c.name.c_str(), c.detail.c_str());
    std::printf("%s\n", verdict.c_str());
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace loom::cli
