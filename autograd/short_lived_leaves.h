// Internal to autograd (tape.cpp, checkpoint.cpp): leaves whose gradient is short-lived. A leaf's
// first gradient is made in the long-lived pool (engine/memory.h), where parameters' gradients stay
// until the optimizer step; a recomputed checkpoint's inputs are leaves too, but their gradient goes
// on to the layer before at once, and its size follows the batch: made in the main pool instead.
#pragma once
#include <vector>

#include "autograd/variable.h"

namespace loom::ag::detail {

// While one lives on a thread, these cells' gradients are made in the main pool.
class ShortLivedLeaves {
 public:
  explicit ShortLivedLeaves(std::vector<const GradCell*> cells);
  ~ShortLivedLeaves();
  ShortLivedLeaves(const ShortLivedLeaves&) = delete;
  ShortLivedLeaves& operator=(const ShortLivedLeaves&) = delete;
  static bool contains(const GradCell* cell);

 private:
  size_t previous_size_;
};

}  // namespace loom::ag::detail
