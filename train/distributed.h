// DistContext: what the Trainer calls at fixed points of a step to train on N processes
// (`mpirun -np N loom train ... --dist ddp|zero2`): the process group, the start-of-run agreement,
// rank r's rows of each global batch, the gradient Reducer behind the grad hooks, the step
// (DDP: clip + Optimizer::step on all-reduced gradients; ZeRO-2: the sharded step), global sums of
// the loss, and checkpoints (ZeRO-2: one optimizer file per rank, re-sharded on load).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "dist/process_group.h"
#include "optim/optimizer.h"
#include "train/data.h"
#include "train/schedule.h"
#include "train/train_checkpoint.h"

namespace loom {

struct TrainConfig;
namespace dist {
class Reducer;
class Zero2;
}  // namespace dist

class DistContext {
 public:
  // mode: "ddp" or "zero2"; anything else is an InvalidArgument naming the choices. cuda: the run's
  // --device is CUDA (each rank then takes cuda:<local rank>).
  static absl::StatusOr<std::unique_ptr<DistContext>> create(const std::string& mode, double timeout_s, bool cuda);
  ~DistContext();

  int rank() const { return group_->rank(); }
  int world() const { return group_->world_size(); }
  bool root() const { return rank() == 0; }
  int local_world() const { return group_->local_size(); }  // ranks on this host
  bool zero2() const { return mode_ == "zero2"; }
  Device device() const { return group_->device(); }

  // Collective: refuses (on every rank) a run whose ranks differ in what they train.
  absl::Status agree(const TrainConfig& cfg, const std::string& model_summary, const DataStats& data,
                     const DataStats& eval_data);
  // After the Optimizer's parameters are registered (sharded for zero2): rank 0's values go to
  // every rank, the Reducer is built and hooked, and rank 0 prints the optimizer memory per rank.
  void attach(optim::Optimizer& opt, bool quiet);

  // Rank r's rows [r * rows, (r + 1) * rows) of a global batch of world * rows rows, with its own
  // token counts. A batch of P pairs in world blocks (Batch::groups): rank r's block, pairs [r P / world, (r + 1) P / world).
  Batch slice(const Batch& global) const;
  // Index of this rank's first row in the global batch (dropout streams follow the global row).
  int64_t first_row(int64_t rows_per_rank) const { return rank() * rows_per_rank; }
  // Before each backward of a step: whether it is the step's last (then gradients are reduced).
  void begin_backward(bool last);
  // After the step's backwards: reduce, clip by the global norm, update; gradients cleared.
  GradNorm step(optim::Optimizer& opt, float lr, float max_norm);
  double sum(double v);
  void sum(std::vector<double>& v);  // element-wise over the ranks, in place
  bool any(bool v);

  // Writes the checkpoint of `step`: rank 0 writes the folder (state, extra files, its optimizer
  // shard or the whole DDP state); with zero2 every other rank adds optimizer-rank<r>.safetensors.
  absl::Status save_checkpoint(const std::string& out_dir, int64_t step, TrainCheckpoint c, optim::Optimizer& opt,
                               bool all_masters, const std::function<absl::Status(const std::string&)>& extra_files);
  // Re-shards a checkpoint's optimizer written by any number of ranks onto this ZeRO-2 run.
  absl::Status load_zero2(const std::string& dir, const TrainCheckpoint& c);

 private:
  DistContext() = default;
  std::string mode_;
  std::unique_ptr<dist::ProcessGroup> group_;
  std::unique_ptr<dist::Reducer> reducer_;
  dist::Zero2* zero2_ = nullptr;  // reducer_ when mode is zero2
  std::vector<ag::Variable> params_;
};

// Restores the optimizer of a checkpoint folder: a ZeRO-2 run re-shards whatever was saved (any
// number of ranks, or an unsharded optimizer); any other run reads an unsharded one and refuses a
// ZeRO-2 checkpoint of several ranks, saying how to resume it. dist may be null.
absl::Status restore_optimizer(DistContext* dist, const std::string& dir, const TrainCheckpoint& c, optim::Optimizer& opt,
                               int64_t default_step);

}  // namespace loom
