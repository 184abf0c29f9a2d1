// The training loop (see trainer.h).
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_format.h"
#include "dist/launch_env.h"
#include "engine/memory.h"
#include "engine/offload.h"
#include "engine/stream_mark.h"
#include "engine/status_macros.h"
#include "optim/adamw.h"
#include "train/checkpointing_plan.h"
#include "train/metrics.h"
#include "train/schedule.h"
#include "train/distributed.h"
#include "train/optimizer_memory.h"
#include "train/train_checkpoint.h"

namespace loom {
namespace fs = std::filesystem;
namespace {

std::atomic<bool> g_stop{false};


uint64_t mix(uint64_t x) {  // splitmix64 finalizer: distinct dropout streams per module
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The tokenized training data in brief: a changed data file (or tokenizer, or template) changes it.
nlohmann::json fingerprint(const std::vector<Example>& examples) {
  uint64_t h = 0xCBF29CE484222325ull, tokens = 0;
  for (const Example& e : examples) {
    for (size_t i = 0; i < e.ids.size(); ++i) h = (h ^ (static_cast<uint64_t>(e.ids[i]) * 2 + e.target[i])) * 0x100000001B3ull;
    h = (h ^ 0xFFFFFFFFull) * 0x100000001B3ull;  // document boundary
    tokens += e.ids.size();
  }
  return {{"examples", examples.size()}, {"tokens", tokens}, {"hash", absl::StrFormat("%016x", h)}};
}

std::string format_duration(double s) {
  const int64_t t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? absl::StrCat(t / 3600, "h", (t % 3600) / 60, "m") : absl::StrCat(t / 60, "m", t % 60, "s");
}

// A micro-batch on the training device. The host side is staged in pinned memory and copied
// asynchronously (pageable copies would block the host on every micro-batch); the pinned blocks
// stay alive with the batch until the step has read its loss back, so no copy outlives them.
struct DeviceBatch {
  Tensor input_ids, targets, positions, segment_ids;  // i32 [b, s], [b*s], [b*s], [b, s]
  std::vector<Tensor> staging;
};

Tensor stage(const Tensor& host, Device device, std::vector<Tensor>& staging) {
  if (!host.defined() || device.is_cpu()) return host;
  Tensor pinned = Tensor::empty_pinned(host.shape(), host.dtype());
  pinned.copy_(host);
  staging.push_back(pinned);
  return pinned.to(device);
}

// Token ids are checked on the host, where they are, before the copy (see check_token_ids).
absl::StatusOr<std::vector<DeviceBatch>> upload(const std::vector<Batch>& batches, Device device, int64_t vocab) {
  std::vector<DeviceBatch> out(batches.size());
  for (size_t i = 0; i < batches.size(); ++i) {
    const Batch& b = batches[i];
    DeviceBatch& d = out[i];
    const Tensor targets = shift_labels(b.labels);
    LOOM_RETURN_IF_ERROR(check_token_ids(b.input_ids, vocab, false, "input_ids"));
    LOOM_RETURN_IF_ERROR(check_token_ids(targets, vocab, true, "targets"));
    d.input_ids = stage(b.input_ids, device, d.staging);
    d.targets = stage(targets, device, d.staging);
    d.positions = stage(b.positions, device, d.staging);
    // Rows that are each one piece of one document need no segment mask (see one_segment_per_row).
    if (!one_segment_per_row(b)) d.segment_ids = stage(b.segment_ids, device, d.staging);
  }
  return out;
}

}  // namespace

struct Trainer::State {
  TrainConfig cfg;
  Device device;
  DType dtype = DType::bf16;
  std::unique_ptr<CausalLM> model;
  Tokenizer tokenizer;
  std::unique_ptr<PackedLoader> loader;
  // f32 masters (the LoRA or f32 weights themselves, or copies of bf16 weights) and the state.
  std::unique_ptr<optim::Optimizer> optimizer;
  LrSchedule schedule;
  int64_t step = 0, total_steps = 0;
  std::vector<float> losses;
  std::optional<MetricsWriter> metrics;
  DataStats stats;
  std::unique_ptr<DistContext> dist;  // data parallelism (--dist), else null
  Checkpointing checkpointing = Checkpointing::kNone;  // the mode in use (--checkpointing auto decided)
  nlohmann::json data_fingerprint;    // what the tokenized data was (a changed file refuses to resume)

  absl::Status save_checkpoint();
  absl::Status check_compatible(const std::string& checkpoint_dir, const nlohmann::json& saved) const;
  absl::Status restore(const std::string& checkpoint_dir, const TrainCheckpoint& c);
  absl::Status save_final();
  nlohmann::json describe() const;
};

Trainer::Trainer(std::unique_ptr<State> state) : s_(std::move(state)) {}
Trainer::~Trainer() = default;
void Trainer::request_stop() { g_stop.store(true); }
int64_t Trainer::step() const { return s_->step; }
int64_t Trainer::total_steps() const { return s_->total_steps; }
const std::vector<float>& Trainer::losses() const { return s_->losses; }
const CausalLM& Trainer::model() const { return *s_->model; }

absl::Status apply_config_file(const std::string& path, std::vector<std::string>* argv,
                               const std::map<std::string, bool>& flags) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read config file ", path, ": ", std::strerror(errno)));
  std::vector<std::string> from_file;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    size_t hash = line.find('#');
    while (hash != std::string::npos && hash > 0 && line[hash - 1] != ' ' && line[hash - 1] != '\t')
      hash = line.find('#', hash + 1);  // a '#' inside a value (a path) is not a comment
    const std::string l(absl::StripAsciiWhitespace(line.substr(0, hash)));
    if (l.empty()) continue;
    const size_t sep = l.find_first_of("=:");
    std::string key(absl::StripAsciiWhitespace(l.substr(0, sep)));
    std::string value = sep == std::string::npos ? "" : std::string(absl::StripAsciiWhitespace(l.substr(sep + 1)));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    const std::string where = absl::StrCat(path, ":", n, ": ");
    auto it = flags.find(key);
    if (it == flags.end()) {
      std::string dashed = key;
      std::replace(dashed.begin(), dashed.end(), '_', '-');
      return absl::InvalidArgumentError(absl::StrCat(where, "unknown key '", key, "'",
                                                     flags.count(dashed) ? absl::StrCat(" (did you mean '", dashed, "'?)") : ""));
    }
    if (it->second) {  // a switch
      const std::string v = absl::AsciiStrToLower(value);
      if (sep == std::string::npos || v == "true" || v == "yes" || v == "on" || v == "1") {
        from_file.push_back("--" + key);
      } else if (v != "false" && v != "no" && v != "off" && v != "0") {
        return absl::InvalidArgumentError(absl::StrCat(where, "'", key, "' is a switch: give true or false (or leave ",
                                                       "the value out), got '", value, "'"));
      }
    } else {
      if (sep == std::string::npos || value.empty())
        return absl::InvalidArgumentError(absl::StrCat(where, "'", key, "' needs a value (`", key, " = ...`)"));
      from_file.push_back("--" + key);
      from_file.push_back(value);
    }
  }
  argv->insert(argv->begin(), from_file.begin(), from_file.end());  // command-line flags come later and win
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::create(const TrainConfig& cfg) {
  auto s = std::make_unique<State>();
  s->cfg = cfg;
  LaunchEnv launch;
  LOOM_ASSIGN_OR_RETURN(launch, detect_launch_env());
  if (launch.world_size > 1 && cfg.dist.empty())
    return absl::InvalidArgumentError(absl::StrCat("launched as rank ", launch.rank, " of ", launch.world_size, " (",
                                                   launch.launcher, "): choose --dist ddp or --dist zero2"));
  s->device = cfg.device;
  if (!cfg.dist.empty()) {  // each rank takes cuda:<local rank>
    LOOM_ASSIGN_OR_RETURN(s->dist, DistContext::create(cfg.dist, cfg.dist_timeout, s->device.is_cuda()));
    s->device = s->dist->device();
  }
  if (s->device.is_cuda() && s->device.index >= cuda_device_count())
    return absl::InvalidArgumentError(absl::StrCat("--device ", cfg.device.str(), ": no such CUDA device (",
                                                   cuda_device_count(), " visible)"));
  if (cfg.dtype != DType::bf16 && cfg.dtype != DType::f32)
    return absl::InvalidArgumentError(absl::StrCat("--dtype must be bf16 or f32, got ", std::string(name(cfg.dtype))));
  s->dtype = cfg.dtype;
  if (cfg.seq_len < 2 || cfg.batch_size < 1 || cfg.grad_accum < 1 || cfg.epochs < 1 || cfg.max_steps < 0)
    return absl::InvalidArgumentError("--seq-len must be >= 2 and --batch-size, --grad-accum, --epochs >= 1");
  if (!(cfg.lr > 0.f)) return absl::InvalidArgumentError(absl::StrCat("--lr must be positive, got ", cfg.lr));
  if (cfg.warmup_steps < 0) return absl::InvalidArgumentError(absl::StrCat("--warmup must be >= 0, got ", cfg.warmup_steps));
  if (!(cfg.weight_decay >= 0.f))
    return absl::InvalidArgumentError(absl::StrCat("--weight-decay must be >= 0, got ", cfg.weight_decay));
  if (!(cfg.max_grad_norm >= 0.f))
    return absl::InvalidArgumentError(absl::StrCat("--max-grad-norm must be >= 0 (0 = no clipping), got ", cfg.max_grad_norm));
  if (cfg.save_total_limit < 0)
    return absl::InvalidArgumentError(absl::StrCat("--save-total-limit must be >= 0, got ", cfg.save_total_limit));
  LrScheduleKind kind;
  LOOM_ASSIGN_OR_RETURN(kind, parse_lr_schedule(cfg.schedule));

  // The output folder must be writable before hours of training are spent.
  std::error_code ec;
  fs::create_directories(cfg.out_dir, ec);
  const fs::path probe = fs::path(cfg.out_dir) / absl::StrCat(".write-test.", getpid());
  if (ec || !std::ofstream(probe)) return absl::PermissionDeniedError(absl::StrCat("output folder ", cfg.out_dir, " is not writable"));
  fs::remove(probe, ec);
  // Leftovers of earlier runs: temporary folders of killed saves; a fresh run's stale checkpoints.
  if (!s->dist || s->dist->root()) {
    const std::vector<std::string> removed = clean_output_folder(cfg.out_dir, /*fresh_run=*/cfg.resume.empty());
    if (!removed.empty() && !cfg.quiet)
      std::printf("removed %zu leftover folder(s) of an earlier run from %s: %s\n", removed.size(), cfg.out_dir.c_str(),
                  absl::StrJoin(removed, ", ").c_str());
  }

  if (cfg.qlora && cfg.full)
    return absl::InvalidArgumentError("--qlora trains LoRA adapters on a frozen 4-bit model; it cannot be combined with --full");
  LoadOptions load;
  load.dtype = s->dtype;
  load.device = s->device;
  load.quantize_4bit = cfg.qlora;
  LOOM_ASSIGN_OR_RETURN(s->model, CausalLM::load(cfg.model_dir, load));
  if (cfg.full)
    for (const Linear* l : s->model->linears())
      if (l->quantized())
        return absl::InvalidArgumentError(absl::StrCat(cfg.model_dir, " is a 4-bit checkpoint (", l->name,
                                                       "): full fine-tuning needs full-precision weights; use LoRA"));
  const ModelConfig& mc = s->model->config();
  s->checkpointing = cfg.checkpointing.value_or(Checkpointing::kNone);
  if (!cfg.checkpointing && s->device.is_cuda()) {  // auto: on the CPU there is no device memory to run out of
    // What every mode adds alike: the trainable parameters' gradients and optimizer state (full
    // fine-tuning: about 16 bytes each; LoRA's adapters are small) and the fused loss's workspace.
    int64_t fixed = 1LL << 30;
    if (cfg.full)
      for (const auto& [name, v] : s->model->named_weights()) fixed += 16 * v->value().numel();
    const CheckpointingNeeds needs =
        estimate_checkpointing_needs(mc, cfg.batch_size * cfg.seq_len, s->model->precision().compute, fixed);
    const CheckpointingChoice choice = choose_checkpointing(needs, device_available_bytes(s->device), s->device.str());
    s->checkpointing = choice.mode;
    if (!cfg.quiet && (!s->dist || s->dist->root())) std::printf("%s\n", choice.reason.c_str());
  }
  s->model->set_checkpointing(s->checkpointing);
  if (cfg.seq_len > mc.max_position_embeddings)
    return absl::InvalidArgumentError(absl::StrCat("--seq-len ", cfg.seq_len, " exceeds the model's max_position_embeddings ",
                                                   mc.max_position_embeddings, " (", cfg.model_dir, "/config.json)"));
  LOOM_ASSIGN_OR_RETURN(s->tokenizer, Tokenizer::load(cfg.model_dir));
  if (s->tokenizer.vocab_size() > mc.vocab_size)
    return absl::InvalidArgumentError(absl::StrCat("the tokenizer has ", s->tokenizer.vocab_size(), " tokens but the model's ",
                                                   "vocab_size is ", mc.vocab_size, ": token ids would be out of range"));
  DataOptions dopt;
  dopt.skip_bad_lines = cfg.skip_bad_lines;
  std::string template_note;
  dopt.chat_template = training_chat_template(cfg.model_dir, cfg.chat_template, &template_note);
  if (!template_note.empty() && !cfg.quiet) std::fprintf(stderr, "loom train: %s\n", template_note.c_str());
  std::vector<Example> examples;
  LOOM_ASSIGN_OR_RETURN(examples, load_jsonl(cfg.data_path, s->tokenizer, dopt, &s->stats));
  if (cfg.skip_bad_lines && s->stats.skipped > 0 && !cfg.quiet)
    std::fprintf(stderr, "loom train: skipped %lld bad line(s) of %lld in %s\n", static_cast<long long>(s->stats.skipped),
                 static_cast<long long>(s->stats.lines), cfg.data_path.c_str());
  s->data_fingerprint = fingerprint(examples);
  const int32_t pad = static_cast<int32_t>(s->tokenizer.eos_id().value_or(0));
  // Every rank packs the global batch (the same on any number of ranks) and trains on its rows.
  const int64_t world = s->dist ? s->dist->world() : 1;
  if (s->dist) LOOM_RETURN_IF_ERROR(s->dist->agree(cfg, mc.summary(), s->stats));
  s->loader = std::make_unique<PackedLoader>(std::move(examples), cfg.seq_len, cfg.batch_size * world, cfg.seed, 0, 1, pad);
  const int64_t per_epoch = std::max<int64_t>(1, s->loader->steps_per_epoch() / cfg.grad_accum);
  s->total_steps = cfg.max_steps > 0 ? cfg.max_steps : per_epoch * cfg.epochs;
  s->schedule = LrSchedule{kind, cfg.warmup_steps, s->total_steps};

  std::optional<std::string> resume_dir;
  TrainCheckpoint resume_from;
  if (!cfg.resume.empty()) {
    ResumePoint point;
    LOOM_ASSIGN_OR_RETURN(point, find_resume_checkpoint(cfg.resume));
    for (const std::string& bad : point.skipped)
      std::fprintf(stderr, "loom train: skipping %s; falling back to an older checkpoint\n", bad.c_str());
    resume_dir = point.dir;
    resume_from = std::move(point.checkpoint);
    LOOM_RETURN_IF_ERROR(s->check_compatible(point.dir, resume_from.state));  // before touching its adapter
  }
  std::unique_ptr<optim::UpdateRule> rule;
  // --offload-optimizer: masters and state in pinned host memory, the update on the CPU.
  const Device state_device = cfg.offload_optimizer ? Device::cpu() : s->device;
  LOOM_ASSIGN_OR_RETURN(rule, optim::make_update_rule(cfg.optim, {cfg.beta1, cfg.beta2, cfg.eps}, state_device));
  s->optimizer = std::make_unique<optim::Optimizer>(
      std::move(rule), /*sharded=*/s->dist && s->dist->zero2(),
      cfg.offload_optimizer ? optim::Placement::kHost : optim::Placement::kDevice);
  const int decay = s->optimizer->add_group({"decay", 1.f, cfg.weight_decay});
  if (cfg.full) {
    // Norms and biases get no weight decay, as transformers' Trainer excludes them.
    const int no_decay = s->optimizer->add_group({"no_decay", 1.f, 0.f});
    s->model->set_weights_trainable(true);
    for (auto& [name, v] : s->model->named_weights()) {
      const bool exempt = name.find("norm") != std::string::npos || name.ends_with(".bias");
      s->optimizer->add_param(name, *v, exempt ? no_decay : decay);
    }
  } else {
    if (resume_dir) {
      LoraConfig saved;
      LOOM_ASSIGN_OR_RETURN(saved, load_adapter(*s->model, *resume_dir));
      s->cfg.lora = saved;
    } else {
      LOOM_RETURN_IF_ERROR(add_lora(*s->model, cfg.lora, cfg.seed));
    }
    uint64_t index = 0;
    for (Linear* l : s->model->linears())
      if (l->lora) l->lora->dropout_seed = mix(cfg.seed ^ mix(++index)), l->lora->training = true;
    for (auto& [name, v] : lora_parameters(*s->model)) s->optimizer->add_param(name, *v, decay);
  }
  if (s->dist) s->dist->attach(*s->optimizer, cfg.quiet);
  else if (cfg.offload_optimizer && !cfg.quiet) print_offload_summary(*s->optimizer);
  if (resume_dir) LOOM_RETURN_IF_ERROR(s->restore(*resume_dir, resume_from));
  if (s->dist && !s->dist->root()) return std::unique_ptr<Trainer>(new Trainer(std::move(s)));  // rank 0 writes
  auto metrics = MetricsWriter::open(cfg.out_dir, resume_dir ? std::optional<int64_t>(s->step) : std::nullopt);
  if (!metrics.ok()) return metrics.status();
  s->metrics.emplace(*std::move(metrics));
  return std::unique_ptr<Trainer>(new Trainer(std::move(s)));
}

nlohmann::json Trainer::State::describe() const {
  return {{"model", model->config().summary()},
          {"total_steps", total_steps},
          {"mode", cfg.full ? "full" : cfg.qlora ? "qlora" : "lora"},
          {"lora_r", cfg.full ? 0 : cfg.lora.r},
          {"seq_len", cfg.seq_len},
          {"batch_size", cfg.batch_size * (dist ? dist->world() : 1)},  // global: any world size resumes
          {"grad_accum", cfg.grad_accum},
          {"seed", cfg.seed},
          {"dtype", std::string(name(cfg.dtype))},
          {"optim", cfg.optim},
          {"data", data_fingerprint},
          {"lr", cfg.lr},
          {"schedule", cfg.schedule},
          {"warmup", cfg.warmup_steps},
          {"weight_decay", cfg.weight_decay}};
}

absl::Status Trainer::State::save_checkpoint() {
  TrainCheckpoint c;
  const LoaderState ls = loader->state();
  c.state = describe();
  c.state["step"] = step;
  c.state["epoch"] = ls.epoch;
  c.state["cursor"] = ls.cursor;
  c.state["offset"] = ls.offset;
  const auto extra = [&](const std::string& dir) {
    return cfg.full ? absl::OkStatus() : save_adapter(*model, cfg.lora, dir);
  };
  if (dist) {
    LOOM_RETURN_IF_ERROR(dist->save_checkpoint(cfg.out_dir, step, std::move(c), *optimizer, cfg.full, extra));
  } else {
    c.tensors = optimizer->state_dict(/*all_masters=*/cfg.full);  // full: the weights themselves
    LOOM_RETURN_IF_ERROR(write_train_checkpoint(cfg.out_dir, step, c, extra));
  }
  if (!dist || dist->root()) prune_checkpoints(cfg.out_dir, cfg.save_total_limit);
  return absl::OkStatus();
}

absl::Status Trainer::State::check_compatible(const std::string& dir, const nlohmann::json& saved) const {
  const nlohmann::json want = describe();
  // What changes the data order or the model refuses; a checkpoint from before a field was saved
  // is not checked on it.
  for (const char* key : {"model", "mode", "lora_r", "seq_len", "batch_size", "grad_accum", "seed", "dtype", "optim", "data"}) {
    if (std::string(key) == "data" && !saved.contains(key)) continue;
    // Checkpoints from before --optim existed were trained with adamw.
    const nlohmann::json got = saved.value(key, std::string(key) == "optim" ? nlohmann::json("adamw") : nlohmann::json());
    if (got != want[key])
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot resume from ", dir, ": it was trained with ", key, " = ", got.dump(), ", this run has ",
          want[key].dump(),
          (std::string(key) == "model" ? " (a different model)"
           : std::string(key) == "data" ? absl::StrCat(" (", cfg.data_path, " is not the data it was trained on)")
                                        : "")));
  }
  // Optimisation settings may change on purpose (a lower lr to finish): said, not refused.
  for (const char* key : {"lr", "schedule", "warmup", "weight_decay"}) {
    if (saved.contains(key) && saved[key] != want[key] && !cfg.quiet)
      std::fprintf(stderr, "loom train: warning: resuming %s with %s = %s; it was trained with %s = %s\n", dir.c_str(), key,
                   want[key].dump().c_str(), key, saved[key].dump().c_str());
  }
  // A longer run continues a shorter one; a decaying schedule is laid over the new total.
  const int64_t saved_total = saved.value("total_steps", total_steps), saved_step = saved.value("step", int64_t{0});
  if (total_steps < saved_step)
    return absl::FailedPreconditionError(absl::StrCat("cannot resume from ", dir, ": it is at step ", saved_step,
                                                      ", past this run's ", total_steps, " steps"));
  if (saved_total != total_steps && !cfg.quiet)
    std::printf("resuming a run of %lld steps as one of %lld%s\n", static_cast<long long>(saved_total),
                static_cast<long long>(total_steps),
                cfg.schedule == "constant" ? "" : absl::StrCat("; the ", cfg.schedule, " schedule now runs over ", total_steps,
                                                               " steps, so the learning rate from here differs").c_str());
  return absl::OkStatus();
}

absl::Status Trainer::State::restore(const std::string& dir, const TrainCheckpoint& c) {
  step = c.state.value("step", int64_t{0});
  // Also refreshes bf16 compute weights from their f32 masters. Checkpoints without per-parameter
  // steps took every parameter through every step.
  LOOM_RETURN_IF_ERROR(restore_optimizer(dist.get(), dir, c, *optimizer, step));
  try {
    loader->set_state({c.state.value("epoch", int64_t{0}), c.state.value("cursor", int64_t{0}),
                       c.state.value("offset", int64_t{0})});
  } catch (const Error& e) {  // a checkpoint from before the data fingerprint, on changed data
    return absl::FailedPreconditionError(absl::StrCat("cannot resume from ", dir, ": its position in the data does not ",
                                                      "exist in ", cfg.data_path, " (was the data file changed?)"));
  }
  if (!cfg.quiet && (!dist || dist->root())) std::printf("resumed from %s at step %lld\n", dir.c_str(), static_cast<long long>(step));
  return absl::OkStatus();
}

absl::Status Trainer::State::save_final() {
  if (dist && !dist->root()) return absl::OkStatus();
  if (cfg.full) {
    LOOM_RETURN_IF_ERROR(save_pretrained(*model, cfg.out_dir));
  } else {
    LOOM_RETURN_IF_ERROR(save_adapter(*model, cfg.lora, cfg.out_dir));
  }
  return write_loss_svg(metrics->path(), (fs::path(cfg.out_dir) / "loss.svg").string());
}

// LOOM_STEP_TIMING=1: each step prints to stderr where its wall time went, the GPU's side from
// marks on the compute stream (engine/stream_mark.h): idle before the step's first work, the
// forward and backward, clipping and the update, each beside the host's time to queue it.
struct StepTiming {
  bool on = std::getenv("LOOM_STEP_TIMING") != nullptr;
  StreamMark prev_end;
  std::chrono::steady_clock::time_point data_done, queued_fb, queued_opt;
  StreamMark start, fb, opt;
  void print(int64_t step, std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point read) {
    using ms = std::chrono::duration<double, std::milli>;
    const double idle = prev_end.recorded() ? StreamMark::elapsed_ms(prev_end, start) : 0.0;
    std::fprintf(stderr,
                 "step %lld timing (ms): device idle before %.2f | device fwd+bwd %.2f (host queued it in %.2f) | device "
                 "clip+update %.2f (host %.2f) | host: data %.2f, waiting for the GPU %.2f\n",
                 static_cast<long long>(step), idle, StreamMark::elapsed_ms(start, fb), ms(queued_fb - data_done).count(),
                 StreamMark::elapsed_ms(fb, opt), ms(queued_opt - queued_fb).count(), ms(data_done - t0).count(),
                 ms(read - queued_opt).count());
    prev_end = opt;
  }
};

absl::Status Trainer::run() {
  State& s = *s_;
  StepTiming timing;
  g_stop.store(false);
  const bool tty = isatty(fileno(stdout)) && (!s.dist || s.dist->root());
  int64_t empty_steps = 0;
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t first_step = s.step;
  int64_t micro = s.step * s.cfg.grad_accum;
  while (s.step < s.total_steps) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Batch> batches;
    int64_t targets = 0, tokens = 0;
    for (int64_t i = 0; i < s.cfg.grad_accum; ++i) {
      batches.push_back(s.loader->next());
      targets += batches.back().target_tokens;  // global counts: the loss is a mean over every rank's tokens
      tokens += batches.back().tokens;
      if (s.dist) batches.back() = s.dist->slice(batches.back());
    }
    if (targets == 0) {  // nothing to learn from in these rows (e.g. prompts cut off): no update
      micro += s.cfg.grad_accum;
      if (++empty_steps > std::max<int64_t>(1, s.loader->steps_per_epoch()))
        return absl::FailedPreconditionError(absl::StrCat("a whole epoch of ", s.cfg.data_path, " has no tokens to train on ",
                                                          "(every target is masked or cut off by --seq-len)"));
      continue;
    }
    empty_steps = 0;
    // Token-weighted mean over the accumulated micro-batches (what transformers does since 4.46),
    // summed on the device: the step reads nothing back until its end.
    if (timing.on) {
      timing.data_done = std::chrono::steady_clock::now();
      timing.start = StreamMark::record(s.device);
    }
    std::vector<DeviceBatch> uploaded;
    LOOM_ASSIGN_OR_RETURN(uploaded, upload(batches, s.device, s.model->config().vocab_size));
    Tensor loss_total;
    for (size_t i = 0; i < batches.size(); ++i) {
      const Batch& b = batches[i];
      // The global row's dropout stream (Philox blocks of 4 elements), so any world size draws the same masks.
      const int64_t row0 = s.dist ? s.dist->first_row(s.cfg.batch_size) : 0;
      for (Linear* l : s.model->linears())
        if (l->lora)
          l->lora->dropout_offset = (static_cast<uint64_t>(micro) << 36) + row0 * s.cfg.seq_len * l->lora->A.size(1) / 4;
      if (s.dist) s.dist->begin_backward(&b == &batches.back());
      ++micro;
      if (b.target_tokens == 0) continue;
      // Fused lm_head + loss: the [tokens, vocab] logits never exist (labels are shifted on the host).
      const DeviceBatch& d = uploaded[i];
      ag::Variable loss = s.model->loss_from_targets(d.input_ids, d.targets, {d.positions, d.segment_ids});
      const float weight = static_cast<float>(b.target_tokens) / static_cast<float>(targets);
      ag::Variable weighted = ag::scale(loss, weight);
      loss_total = loss_total.defined() ? ops::add(loss_total, weighted.value()) : weighted.value();
      ag::backward(weighted);
    }
    if (timing.on) {
      timing.queued_fb = std::chrono::steady_clock::now();
      timing.fb = StreamMark::record(s.device);
    }
    const float lr = s.schedule.lr(s.cfg.lr, s.step);
    GradNorm gn;
    Tensor norm_coef;  // single process: [norm, clip coefficient], computed and used on the device
    if (s.dist) {  // reduce over the ranks, clip by the global norm, update (ZeRO-2: the shard)
      gn = s.dist->step(*s.optimizer, lr, s.cfg.max_grad_norm);
    } else {
      std::vector<Tensor> grads;
      for (const auto& p : s.optimizer->params())
        if (p.var.grad().defined()) grads.push_back(p.var.grad());
      norm_coef = ops::grad_norm_coef(grads, s.cfg.max_grad_norm > 0 ? s.cfg.max_grad_norm : INFINITY);
      // The clipping factor scales the gradients inside the update, read where the update runs.
      s.optimizer->step(lr, norm_coef.narrow(0, 1, 1));
    }
    s.optimizer->zero_grad();
    if (timing.on) {
      timing.queued_opt = std::chrono::steady_clock::now();
      timing.opt = StreamMark::record(s.device);
    }
    ++s.step;
    // The step's one read-back (with the grad norm's); a rank whose rows had no targets adds 0.
    double loss_sum = loss_total.defined() ? loss_total.to_doubles()[0] : 0.0;
    if (norm_coef.defined()) {
      const std::vector<double> nc = norm_coef.to_doubles();
      gn.norm = static_cast<float>(nc[0]);
      gn.coef = static_cast<float>(nc[1]);
    }
    if (timing.on) timing.print(s.step, t0, std::chrono::steady_clock::now());
    if (s.dist) loss_sum = s.dist->sum(loss_sum);
    s.losses.push_back(static_cast<float>(loss_sum));
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    StepMetrics m;
    m.step = s.step;
    m.epoch = static_cast<double>(s.loader->state().epoch) +
              static_cast<double>(s.loader->state().cursor) / std::max<int64_t>(1, s.stats.examples);
    m.loss = loss_sum;
    m.lr = lr;
    m.grad_norm = gn.norm;
    m.tokens = targets;
    m.tokens_per_s = static_cast<double>(tokens) / dt;
    m.mem_bytes = memory_stats(s.device).peak_bytes;
    if (s.checkpointing == Checkpointing::kOffload) m.host_mem_bytes = offload_stats().peak_host_bytes;
    if (s.metrics) LOOM_RETURN_IF_ERROR(s.metrics->write(m));
    if (!s.cfg.quiet && s.metrics && (tty || s.step % std::max<int64_t>(1, s.cfg.log_every) == 0 || s.step == s.total_steps)) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      const double eta = elapsed / static_cast<double>(s.step - first_step) * static_cast<double>(s.total_steps - s.step);
      std::printf("%sstep %lld/%lld | loss %.4f | lr %.3g | grad %.3g | %.0f tok/s | mem %.2f GB%s | ETA %s%s",
                  tty ? "\r\033[K" : "", static_cast<long long>(s.step), static_cast<long long>(s.total_steps), loss_sum,
                  lr, gn.norm, m.tokens_per_s, static_cast<double>(m.mem_bytes) / 1e9,
                  m.host_mem_bytes >= 0 ? absl::StrFormat(" (+%.2f GB host)", static_cast<double>(m.host_mem_bytes) / 1e9).c_str() : "",
                  format_duration(eta).c_str(),
                  tty ? "" : "\n");
      std::fflush(stdout);
    }
    bool stopping = g_stop.load() || (s.cfg.stop_after > 0 && s.step - first_step >= s.cfg.stop_after);
    if (s.dist) stopping = s.dist->any(stopping);  // a signal may reach the ranks in different steps
    if ((s.cfg.save_every > 0 && s.step % s.cfg.save_every == 0) || stopping) LOOM_RETURN_IF_ERROR(s.save_checkpoint());
    if (stopping && s.step < s.total_steps) {
      // The adapter (or model) so far at the top of --out too, as "output in ..." promises.
      LOOM_RETURN_IF_ERROR(s.save_final());
      if (!s.cfg.quiet && s.metrics) std::printf("%sstopped by signal at step %lld; checkpoint saved in %s\n", tty ? "\n" : "",
                                    static_cast<long long>(s.step), s.cfg.out_dir.c_str());
      return absl::OkStatus();
    }
  }
  if (tty && !s.cfg.quiet) std::printf("\n");
  if (s.cfg.save_every == 0 || s.step % s.cfg.save_every != 0) LOOM_RETURN_IF_ERROR(s.save_checkpoint());
  return s.save_final();
}

}  // namespace loom
