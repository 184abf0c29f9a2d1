// Trainer: the `loom train` loop as a library. LoRA on frozen base weights or full fine-tuning
// (f32 master weights and AdamW state, bf16 compute weights), packed JSONL data, gradient
// accumulation, global-norm clipping, LR schedules, metrics, atomic checkpoints and exact resume.
#pragma once
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/causal_lm.h"
#include "models/lora.h"
#include "train/data.h"
#include "train/train_config.h"

namespace loom {



class Trainer {
 public:
  // Loads the model, tokenizer and data, sets up LoRA or full fine-tuning, restores a checkpoint
  // when config.resume is set. Every user error is a Status naming what and where.
  static absl::StatusOr<std::unique_ptr<Trainer>> create(const TrainConfig& config);
  ~Trainer();

  // Trains to the end (or until stop() is requested: then it finishes the step, saves and returns).
  absl::Status run();
  // Safe from a signal handler.
  static void request_stop();

  int64_t step() const;
  int64_t total_steps() const;
  const std::vector<float>& losses() const;  // per completed step of this run
  const CausalLM& model() const;
  Checkpointing checkpointing() const;  // the mode in use (what --checkpointing auto chose)

 private:
  struct State;
  explicit Trainer(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

}  // namespace loom
