// Internal to autograd (checkpoint.cpp, fn_attention.cpp): values a checkpoint's first run sends
// ahead to its rerun in backward, so that the rerun takes them instead of computing them again.
// Under offload checkpointing each attention's output and log-sum-exp go this way: to pinned host
// memory with the layer's input, within the room the forward gave its checkpoints (what the layer
// inputs, which must leave the GPU, leave of the pinned budget); an entry that does not fit is
// dropped and its rerun computes it. The rerun asks for the entries in the order the first run
// gave them.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "engine/offload.h"
#include "engine/tensor.h"

namespace loom::ag::detail {

// Pinned bytes the stashes of one forward may still fill, shared by its checkpoints.
using StashRoom = std::atomic<int64_t>;

class Stash {
 public:
  // A stash that puts nothing (the checkpoint does not stash), or one taking from room.
  Stash() = default;
  explicit Stash(std::shared_ptr<StashRoom> room) : room_(std::move(room)) {}
  // First run: offloads the values, all or none of them (none when the room has not their bytes).
  void put(const std::vector<Tensor>& values);
  // Rerun: the next entry's values back on their device, or nullopt for a dropped one.
  std::optional<std::vector<Tensor>> take();
  // Starts copying every entry back (the checkpoint before this one's backward calls it).
  void prefetch();

 private:
  std::shared_ptr<StashRoom> room_;
  std::vector<std::vector<std::shared_ptr<OffloadedTensor>>> entries_;  // an empty one was dropped
  size_t next_ = 0;
};

// The stash the calling thread's function writes to (its first run) or reads from (its rerun)
// while one lives; null outside a checkpoint that stashes.
class StashScope {
 public:
  StashScope(Stash* stash, bool replay);
  ~StashScope();
  StashScope(const StashScope&) = delete;
  StashScope& operator=(const StashScope&) = delete;
  static Stash* writing();  // the first run's, or null
  static Stash* reading();  // the rerun's, or null

 private:
  Stash* previous_;
  bool previous_replay_;
};

}  // namespace loom::ag::detail
