// Asynchronous copies between a CUDA device and pinned host memory on two side streams per device
// (one each way), ordered against the compute stream with events: what CPU optimizer offload uses
// to move gradients down and updated weights up while the host computes. Between CPU tensors they
// are plain copies whose events are already complete.
#pragma once
#include <memory>

#include "engine/tensor.h"

namespace loom {

class TransferEvent {
 public:
  TransferEvent() = default;  // complete
  // Blocks the host until the copy is done.
  void wait() const;
  // The compute stream of the copy's device waits for it (the host does not block).
  void order_compute() const;

  struct Impl;

 private:
  friend TransferEvent copy_to_host_async(const Tensor&, Tensor&);
  friend TransferEvent copy_to_device_async(const Tensor&, Tensor&);
  std::shared_ptr<Impl> impl_;
};

// dst (host, contiguous; pinned when src is on a GPU) <- src (same dtype and shape, contiguous), on
// src's device's download stream after the work queued so far on its compute stream. src and dst
// must stay alive and unchanged until the event completes.
TransferEvent copy_to_host_async(const Tensor& src, Tensor& dst);
// dst (contiguous) <- src (host, contiguous; pinned when dst is on a GPU; same dtype and shape), on
// dst's device's upload stream after the work queued so far on its compute stream. Call
// order_compute() on the event (or on a later one of the same stream) before dst is used.
TransferEvent copy_to_device_async(const Tensor& src, Tensor& dst);

}  // namespace loom
