// ZeRO-2 over an optim::Optimizer registered in sharded mode: the trainable parameters live in one
// flat padded buffer (shard_layout.h, reverse registration order so that backward fills it front
// to back); each rank owns one contiguous shard of the f32 master weights, of the update rule's
// state (AdamW's f32 moments or 8-bit AdamW's blocks: the Optimizer's UpdateRule runs on the
// shard's pieces, nothing is re-implemented) and of the gradients. Gradients are reduce-scattered
// bucket by bucket as backward produces them (the leaf gradients are released once copied, each
// bucket once its collective is done: a few buckets live at a time), kept in f32 on the owner,
// clipped by the global norm across shards, the shard is stepped and the updated weights are
// all-gathered in the compute dtype into the parameters. With an Optimizer of
// placement kHost (CPU offload) the shard's masters and state live in pinned host memory and the
// shard is stepped on the CPU (optim/host_update.h): each rank offloads only its shard.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dist/ddp.h"
#include "dist/reducer.h"
#include "dist/shard_layout.h"
#include "optim/host_update.h"
#include "optim/optimizer.h"

namespace loom::dist {

struct ClipResult {
  float norm = 0.f;  // global L2 norm of the summed gradients
  float coef = 1.f;  // torch.nn.utils.clip_grad_norm_'s factor, applied inside the update
};

class Zero2 : public Reducer {
 public:
  // Reduce-scatters still running while backward goes on; older buckets are settled (converted
  // into the f32 shard and freed), so a step holds a few buckets, not a full-size copy of the gradients.
  static constexpr size_t kBucketsInFlight = 2;

  // opt: constructed with sharded = true, parameters registered; all of one dtype and device.
  // Masters start from the parameters' current values (broadcast them first).
  Zero2(Communicator& comm, optim::Optimizer& opt, int64_t bucket_bytes = kDefaultBucketBytes);

  void add(int index, Tensor& grad) override;
  void finalize() override;
  // Clip (max_norm <= 0: no clipping), step every piece of this shard with lr times its group's
  // scale, all-gather the new weights into the parameters, and clear the gradient shard.
  ClipResult step(float lr, float max_norm);

  const ShardLayout& layout() const { return layout_; }
  // Bytes this rank holds for the optimizer: f32 masters and rule state of its shard (on the host
  // when the Optimizer is offloaded).
  int64_t shard_bytes() const;
  // Bytes of this rank's f32 masters (part of shard_bytes()).
  int64_t master_bytes() const { return master_.nbytes(); }
  // What one unsharded rank would hold for the same (masters counted where the Optimizer keeps them).
  int64_t unsharded_bytes() const;

  // This rank's pieces under the Optimizer's names ("master.<p>", "<state>.<p>", "step.<p>" for
  // every parameter, the rule's shared tensors). With world 1 it is an Optimizer::state_dict(true).
  std::map<std::string, Tensor> state_dict() const;
  // Re-shards: `ranks` are the state_dict()s written by the `ranks.size()` ranks of an earlier run
  // (any world size; one Optimizer::state_dict is a world of one). A missing f32 master is taken
  // from the parameter's value (LoRA checkpoints keep the weights in the adapter).
  absl::Status load_state_dicts(const std::vector<std::map<std::string, Tensor>>& ranks, const std::string& where);

 private:
  struct Piece {
    ShardPiece at;
    int param = 0;  // registration index
    std::vector<Tensor> state;
    std::vector<std::string> state_names;
  };
  struct Bucket {
    int first = 0, last = 0;  // flat-order parameter indices [first, last)
    int64_t lo = 0, hi = 0;   // flat range
    Tensor buffer;            // the gradients in flat order, until handed to the reduce-scatter
    int ready = 0;
    int64_t ticket = 0;       // the reduce-scatter's (Communicator::issued())
    Tensor received, dst;     // this rank's reduced part in the compute dtype, and its f32 place in grad_
  };
  void launch_ready();
  void launch(Bucket& b);
  void settle(size_t end);  // buckets [settled_, end): wait for their collective, convert, free

  Communicator& comm_;
  optim::Optimizer& opt_;
  std::vector<int> order_;     // flat position -> registration index
  std::vector<int> position_;  // registration index -> flat position
  ShardLayout layout_;
  DType dtype_;
  Device device_;
  Tensor master_, grad_;  // this rank's shard: f32 (pinned host when offloaded), f32 on the device
  optim::HostUpdater host_;         // offloaded: the shard's CPU step
  std::vector<Piece> pieces_;
  std::vector<int64_t> steps_;  // per registered parameter
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // flat position -> bucket
  std::vector<bool> arrived_;
  size_t next_ = 0;     // the next bucket to launch
  size_t settled_ = 0;  // buckets before it are reduced into grad_ and freed
};

}  // namespace loom::dist
