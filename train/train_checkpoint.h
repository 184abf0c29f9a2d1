// Training checkpoints: <out>/checkpoint-<step>/ holding the adapter (LoRA), the optimizer's state
// with the f32 master weights of full fine-tuning (optimizer.safetensors) and trainer_state.json (step, data position,
// what was trained). Assembled under a temporary name and renamed, so a crash never leaves a
// half-written checkpoint.
#pragma once
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "engine/tensor.h"
#include "nlohmann/json.hpp"

namespace loom {

struct TrainCheckpoint {
  nlohmann::json state;                   // trainer_state.json
  std::map<std::string, Tensor> tensors;  // optimizer.safetensors: optim::Optimizer::state_dict(), dtypes kept
};

// Writes dir_tmp contents via `fill` (which may add further files such as the adapter), then
// renames into <out_dir>/checkpoint-<step>.
absl::Status write_train_checkpoint(const std::string& out_dir, int64_t step, const TrainCheckpoint& ckpt,
                                    const std::function<absl::Status(const std::string& dir)>& extra_files);

// `path` is a checkpoint folder (has trainer_state.json) or an output folder (its highest
// checkpoint-<step>). Returns the checkpoint folder.
absl::StatusOr<std::string> resolve_checkpoint(const std::string& path);
absl::StatusOr<TrainCheckpoint> read_train_checkpoint(const std::string& checkpoint_dir);

}  // namespace loom
