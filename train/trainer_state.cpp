// A run's checkpoints: what it is (describe, checked on resume), saving, restoring, the final output.
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/status_macros.h"
#include "train/optimizer_memory.h"
#include "train/run_options.h"
#include "train/trainer_internal.h"

namespace loom {
namespace fs = std::filesystem;

nlohmann::json Trainer::State::describe() const {
  return {{"model", model->config().summary()},
          {"total_steps", total_steps},
          {"mode", cfg.full ? "full" : cfg.qlora ? "qlora" : "lora"},
          {"lora_r", cfg.full ? 0 : cfg.lora.r},
          {"seq_len", cfg.seq_len},
          {"batch_size", cfg.batch_size * (dist ? dist->world() : 1)},  // global: any world size resumes
          {"grad_accum", cfg.grad_accum},
          {"seed", cfg.seed},
          {"dtype", std::string(name(dtype))},
          {"optim", cfg.optim},
          {"data", data_fingerprint},
          {"lr", cfg.lr},
          {"schedule", cfg.schedule},
          {"warmup", cfg.warmup_steps},
          {"weight_decay", cfg.weight_decay},
          // Every option as given (run_options.h): `loom train --resume RUN` alone continues with these.
          {"options", stored_options(cfg)}};
}

void Trainer::State::remove_stale_checkpoints() {
  if (!stale_checkpoints) return;
  stale_checkpoints = false;
  if (dist && !dist->root()) return;
  const std::vector<std::string> removed = clean_output_folder(cfg.out_dir, /*fresh_run=*/true);
  if (!removed.empty() && !cfg.quiet)
    std::printf("removed %zu checkpoint folder(s) of an earlier run from %s: %s\n", removed.size(), cfg.out_dir.c_str(),
                absl::StrJoin(removed, ", ").c_str());
}

absl::Status Trainer::State::save_checkpoint() {
  remove_stale_checkpoints();
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
  // What changes the data order or the model refuses, every difference at once; a checkpoint from
  // before a field was saved is not checked on it.
  std::vector<std::string> differ;
  for (const char* key : {"model", "mode", "lora_r", "seq_len", "batch_size", "grad_accum", "seed", "dtype", "optim", "data"}) {
    const std::string k = key;
    if (k == "data" && !saved.contains(key)) continue;
    // Checkpoints from before --optim existed were trained with adamw.
    const nlohmann::json got = saved.value(key, k == "optim" ? nlohmann::json("adamw") : nlohmann::json());
    if (got == want[key]) continue;
    const std::string what = k == "batch_size" ? "global batch (--batch-size x ranks)" : k;
    differ.push_back(absl::StrCat(what, " = ", got.dump(), " (this run: ", want[key].dump(),
                                  k == "model"  ? ", a different model)"
                                  : k == "data" ? absl::StrCat(": ", cfg.data_path, " is not the data it was trained on)")
                                                : ")"));
  }
  if (!differ.empty())
    return absl::FailedPreconditionError(absl::StrCat("cannot resume from ", dir, ": it was trained with ",
                                                      absl::StrJoin(differ, "; ")));
  // Optimisation settings may change on purpose (a lower lr to finish): said, not refused.
  if (!cfg.quiet && saved.contains("options"))
    for (const auto& [key, was, now] : warned_changes(saved["options"], want["options"]))
      std::fprintf(stderr, "loom train: warning: resuming %s with --%s %s; it was trained with %s\n", dir.c_str(),
                   key.c_str(), now.c_str(), was.c_str());
  else if (!cfg.quiet)  // a checkpoint from before the options were stored
    for (const char* key : {"lr", "schedule", "warmup", "weight_decay"})
      if (saved.contains(key) && saved[key] != want[key])
        std::fprintf(stderr, "loom train: warning: resuming %s with %s = %s; it was trained with %s = %s\n", dir.c_str(), key,
                     want[key].dump().c_str(), key, saved[key].dump().c_str());
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
  remove_stale_checkpoints();
  if (dist && !dist->root()) return absl::OkStatus();
  if (cfg.full) {
    LOOM_RETURN_IF_ERROR(save_pretrained(*model, cfg.out_dir));
  } else {
    LOOM_RETURN_IF_ERROR(save_adapter(*model, cfg.lora, cfg.out_dir));
  }
  return write_loss_svg(metrics->path(), (fs::path(cfg.out_dir) / "loss.svg").string());
}

}  // namespace loom
