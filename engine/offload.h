// Activation offload: a CUDA tensor copied to pinned host memory on a side stream while compute
// goes on, and copied back (ahead of need, on the same side stream) before it is used again.
// Recompute checkpointing keeps each decoder layer's input this way (autograd/checkpoint.cpp).
#pragma once
#include <cstdint>
#include <memory>

#include "engine/tensor.h"

namespace loom {

class OffloadedTensor {
 public:
  // Starts the device-to-host copy of t (a CUDA tensor) after the work queued so far on t's
  // device's compute stream. When the pinned budget (set_offload_host_budget) is spent, t stays on
  // the GPU instead and fetch() returns it as it is. CPU tensors are kept as they are.
  static std::shared_ptr<OffloadedTensor> offload(const Tensor& t);
  // As offload(), for a tensor sent to host memory mid-layer (the attention stash): null (nothing
  // copied, nothing kept) when the pinned budget has no room for it, and the compute stream is not
  // made to wait for earlier copies down (offload() does, to release their device blocks: the next
  // layer input's offload does it for these). CPU tensors are kept as they are.
  static std::shared_ptr<OffloadedTensor> offload_or_drop(const Tensor& t);
  // Holds t where it is (fetch() returns it): the no-offload case behind the same interface.
  static std::shared_ptr<OffloadedTensor> keep(const Tensor& t);
  ~OffloadedTensor();
  OffloadedTensor(const OffloadedTensor&) = delete;
  OffloadedTensor& operator=(const OffloadedTensor&) = delete;

  // Starts the host-to-device copy back on the side stream (no-op when already started or kept).
  void prefetch();
  // The tensor on its device, ordered on the compute stream after the copy back (prefetch() first
  // if it was not called). Frees the host copy.
  Tensor fetch();
  bool on_host() const { return on_host_; }

  struct Event;  // a CUDA event, destroyed with its last holder (offload.cpp's in-flight list holds some)

 private:
  OffloadedTensor() = default;
  // offload() (optional = false) and offload_or_drop() (true).
  static std::shared_ptr<OffloadedTensor> copy_down(const Tensor& t, bool optional);
  Tensor device_;  // a kept (not offloaded) tensor, or the copy back
  Tensor host_;    // pinned
  int device_index_ = -1;
  bool on_host_ = false, fetching_ = false;
  std::shared_ptr<Event> down_, up_;  // the copies' completion
};

// Pinned host bytes that offloaded tensors may hold at once (default: 80 % of MemAvailable at the
// first offload, shared by the processes of this host that set_offload_host_sharers names; a
// negative value restores it). Beyond it tensors stay on the GPU ("where host memory is short").
void set_offload_host_budget(int64_t bytes);
// The number of processes on this host that offload (the ranks of a distributed run on it; 1
// alone): each one's default budget is its share, so that together they stay within MemAvailable.
void set_offload_host_sharers(int processes);
// The pinned bytes still free under the budget now.
int64_t offload_host_room();
struct OffloadStats {
  int64_t host_bytes = 0, peak_host_bytes = 0;  // pinned bytes held by offloaded tensors
  int64_t kept_on_device = 0;                   // tensors the budget kept on the GPU
};
OffloadStats offload_stats();
void reset_offload_peak();

}  // namespace loom
