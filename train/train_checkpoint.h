// Training checkpoints: <out>/checkpoint-<step>/ holding the adapter (LoRA), the optimizer's state
// with the f32 master weights of full fine-tuning (optimizer.safetensors) and trainer_state.json (step, data position,
// what was trained), and checksums.json (a checksum of every other file, verified on load).
// Assembled under a temporary name and renamed, so a crash never leaves a half-written checkpoint.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

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

// How a checkpoint is read back. no_verify skips the checksums (checksums.json missing or not
// matching: --no-verify); the values are still checked (counters in range, optimizer state finite,
// second moments >= 0), since a checkpoint holding NaN would poison every run resumed from it.
struct ResumeOptions {
  bool no_verify = false;
};

// `path` is a checkpoint folder (has trainer_state.json) or an output folder (its highest
// checkpoint-<step>). Returns the checkpoint folder.
absl::StatusOr<std::string> resolve_checkpoint(const std::string& path);
// Reads a checkpoint; a file whose checksum does not match, or a missing checksums.json, is DataLoss
// naming it (unless options.no_verify); a counter out of range, a step.<param> < 0, a NaN or
// infinite optimizer tensor or a negative second moment is DataLoss naming the file and field/tensor.
absl::StatusOr<TrainCheckpoint> read_train_checkpoint(const std::string& checkpoint_dir,
                                                      const ResumeOptions& options = {});

// What --resume PATH continues from: PATH itself when it is a checkpoint folder, else the newest
// intact checkpoint-<step> in it; newer ones that read_train_checkpoint refuses (corrupted, damaged
// values, no checksums) are skipped and listed (file: reason).
struct ResumePoint {
  std::string dir;
  TrainCheckpoint checkpoint;
  std::vector<std::string> skipped;
};
absl::StatusOr<ResumePoint> find_resume_checkpoint(const std::string& path, const ResumeOptions& options = {});

// Largest step, epoch, cursor or offset a checkpoint may hold (2^40: ten thousand years at three
// steps a second); beyond it the trainer_state.json was tampered with.
inline constexpr int64_t kMaxCheckpointCount = int64_t{1} << 40;

// Removes what an earlier process left in an output folder: .checkpoint-<step>.tmp.<pid> folders
// of processes that no longer run and, for a fresh (not resumed) run, the checkpoint-<step>
// folders of the earlier run (which a later --resume would otherwise pick). Returns their names.
std::vector<std::string> clean_output_folder(const std::string& out_dir, bool fresh_run);
// --save-total-limit: removes all but the newest `keep` checkpoints (keep <= 0: none removed).
std::vector<std::string> prune_checkpoints(const std::string& out_dir, int64_t keep);

}  // namespace loom
