// Trainer: the `loom train` loop as a library. LoRA on frozen base weights or full fine-tuning
// (f32 master weights and AdamW state, bf16 compute weights), packed JSONL data, gradient
// accumulation, global-norm clipping, LR schedules, metrics, atomic checkpoints and exact resume.
#pragma once
#include <atomic>
#include <chrono>
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
  struct QueuedStep;  // a step queued on the device, its results not read yet (trainer.cpp)
  struct StepTiming;  // LOOM_STEP_TIMING's marks
  explicit Trainer(std::unique_ptr<State> state);
  // One step's work queued (false: its rows had nothing to learn from), and its results read.
  absl::StatusOr<bool> queue_step(StepTiming& timing, int64_t& micro, int64_t& empty_steps, QueuedStep& q);
  absl::Status finish_step(StepTiming& timing, QueuedStep& q, std::chrono::steady_clock::time_point& last_finish,
                           bool& line_open, bool& stopped);
  std::unique_ptr<State> s_;
  std::chrono::steady_clock::time_point run_start_;
  int64_t first_step_ = 0;
};

}  // namespace loom
