// A buffer kept for weights dequantised on every use (QLoRA experts, a chunk of experts at a time:
// models/layers.h's kDequantChunkBytes). Made and freed among the activations, such blocks
// fragmented CUDA's stream-ordered pool: the 4-layer QLoRA offload row held 6.47 GiB in the pool for
// 4.99 GiB in use; with kept buffers the excess went from 1.48 to 0.52 GiB (sessions 33 and 34).
// One buffer per device, made in the long-lived pool (engine/memory.h) and handed out again, whatever
// the shape and dtype, whenever nothing else holds it.
#pragma once
#include <memory>
#include <mutex>
#include <vector>

#include "engine/tensor.h"

namespace loom {

class DequantScratch {
 public:
  // What a taker writes into the buffer: `count` experts from `source` (the first one's NF4 weight,
  // held here so that no other object takes its address while the buffer names it), in the shape and
  // dtype it took.
  struct Contents {
    std::shared_ptr<const void> source;
    int64_t count = 0;
    bool operator==(const Contents& o) const { return source == o.source && count == o.count; }
  };
  // An uninitialised [shape] tensor of dtype on device: a view of the device's kept buffer when no
  // tensor outside this scratch shares it (the last product that read it was queued before on the
  // device's compute stream, where the caller writes it: in stream order), grown first if it is too
  // small; a new tensor, not kept, when it is held. The caller overwrites every element.
  Tensor take(const Shape& shape, DType dtype, Device device);
  // The same, for a caller that writes `contents`. *ready is set when the kept buffer already holds
  // them in this shape and dtype (a taker wrote them and said so with filled(), and nothing has taken
  // it since): the caller need not write them again. A product's backward that walks its chunks of
  // experts in the reverse order of its forward finds the last one there.
  Tensor take(const Shape& shape, DType dtype, Device device, const Contents& contents, bool* ready);
  // After the caller wrote `contents` into t, a tensor take() gave it (no-op for a one-off). Until
  // then, and after any other take, the buffer's contents are unknown: a write that failed midway, or
  // a taker that changes the values afterwards (it must not say filled), is never taken for them.
  void filled(const Tensor& t, const Contents& contents);
  // Bytes the kept buffers hold.
  int64_t kept_bytes() const;
  // Buffers handed out to be written so far (tests: how many dequantisations a step makes).
  int64_t taken() const;

 private:
  struct Kept {
    std::shared_ptr<Storage> storage;
    Contents contents;  // what its last taker wrote (source null: unknown)
    Shape shape;
    DType dtype = DType::bf16;
  };
  mutable std::mutex mu_;
  std::vector<Kept> kept_;  // one per device
  int64_t taken_ = 0;
};

}  // namespace loom
