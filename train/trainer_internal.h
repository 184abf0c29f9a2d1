// Internal to the Trainer (train/trainer*.cpp): what a run holds, shared by its setup
// (trainer_setup.cpp), its checkpoints (trainer_state.cpp) and its loop (trainer.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "optim/optimizer.h"
#include "train/checkpointing_plan.h"
#include "train/distributed.h"
#include "train/metrics.h"
#include "train/objective.h"
#include "train/pair_loader.h"
#include "train/preference_data.h"
#include "train/schedule.h"
#include "train/train_checkpoint.h"
#include "train/trainer.h"

namespace loom {

// --pair-layout as a PairLayout.
inline PairLayout pair_layout(const TrainConfig& cfg) { return cfg.pair_layout == "pad" ? PairLayout::kPad : PairLayout::kPack; }

// The tokenized training data in brief: a changed data file (or tokenizer, or template) changes it.
nlohmann::json fingerprint(const std::vector<Example>& examples);

struct Trainer::State {
  TrainConfig cfg;
  Device device;
  DType dtype = DType::bf16;
  std::unique_ptr<CausalLM> model;
  Tokenizer tokenizer;
  std::unique_ptr<BatchLoader> loader;  // packed rows (sft) or pairs (preference objectives)
  // f32 masters (the LoRA or f32 weights themselves, or copies of bf16 weights) and the state.
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<Objective> objective;  // what the step minimises (the loop names none)
  LrSchedule schedule;
  int64_t step = 0, total_steps = 0;
  std::vector<float> losses;
  std::optional<MetricsWriter> metrics;
  DataStats stats;
  PreferenceStats pair_stats;  // preference objectives: pairs read, truncated, dropped
  // --eval-data packed once at setup: one pass in global batches (every rank evaluates its rows).
  std::vector<Batch> eval_batches;
  DataStats eval_stats;
  std::unique_ptr<DistContext> dist;  // data parallelism (--dist), else null
  Checkpointing checkpointing = Checkpointing::kNone;  // the mode in use (--checkpointing auto decided)
  // --precompute-ref: the training pairs then the held-out ones, kept until prepare_reference scores them.
  std::vector<PreferenceExample> reference_pairs;
  std::unique_ptr<CausalLM> reference_model;  // --full dpo/ipo without --precompute-ref: the frozen start
  nlohmann::json data_fingerprint;    // what the tokenized data was (a changed file refuses to resume)
  // A fresh run into a folder holding an earlier run's checkpoint-<step> folders removes them when
  // it saves for the first time, not at start: a run that fails first loses nothing.
  bool stale_checkpoints = false;

  // Removes the earlier run's checkpoints (once, on the writing rank) before this run's first save.
  void remove_stale_checkpoints();

  absl::Status save_checkpoint();
  absl::Status check_compatible(const std::string& checkpoint_dir, const nlohmann::json& saved) const;
  absl::Status restore(const std::string& checkpoint_dir, const TrainCheckpoint& c);
  absl::Status save_final();
  // eval_batches' mean loss over the objective's units (SFT: target tokens) with the current weights,
  // and the objective's measures averaged alike into `measures` (trainer.cpp).
  absl::StatusOr<double> evaluate(std::vector<std::pair<std::string, double>>* measures = nullptr);
  // Preference objectives with a reference (preference_setup.cpp): a frozen copy for --full, or the
  // table of --precompute-ref read from the run folder or scored now. After the adapters exist.
  absl::Status prepare_reference(const LoadOptions& load, bool resumed);
  // --eval-data in a preference format: the held-out pairs as eval_batches, their pair ids after
  // the `first_id` training pairs (preference_setup.cpp).
  absl::Status load_eval_pairs(const PreferenceDataOptions& options, int32_t pad, int64_t world, int64_t first_id);
  nlohmann::json describe() const;
  // The lines a run prints before its first step (start_summary.cpp).
  std::string start_summary(int64_t steps_per_epoch) const;
};

}  // namespace loom
