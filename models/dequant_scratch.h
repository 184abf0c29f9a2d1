// A buffer kept for weights dequantised on every use (QLoRA experts, a chunk of experts at a time:
// models/layers.h's kDequantChunkBytes). Made and freed among the activations, such blocks
// fragmented CUDA's stream-ordered pool: the 4-layer QLoRA offload row held 6.47 GiB in the pool for
// 4.99 GiB in use; with kept buffers the excess went from 1.48 to 0.52 GiB (sessions 33 and 34).
// One buffer per device, made in the long-lived pool (engine/memory.h) and handed out again, whatever
// the shape and dtype, whenever nothing else holds it.
#pragma once
#include <mutex>
#include <vector>

#include "engine/tensor.h"

namespace loom {

class DequantScratch {
 public:
  // An uninitialised [shape] tensor of dtype on device: a view of the device's kept buffer when no
  // tensor outside this scratch shares it (the last product that read it was queued before on the
  // device's compute stream, where the caller writes it: in stream order), grown first if it is too
  // small; a new tensor, not kept, when it is held. The caller overwrites every element.
  Tensor take(const Shape& shape, DType dtype, Device device);
  // Bytes the kept buffers hold.
  int64_t kept_bytes() const;
  // take() calls so far (tests: how many dequantisations a step makes).
  int64_t taken() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Storage>> kept_;  // one per device
  int64_t taken_ = 0;
};

}  // namespace loom
