// Storage (an owned or borrowed block of bytes on one device) and the allocators behind it:
// 64-byte-aligned host memory, pinned host memory, and the stream-ordered CUDA pool. Per-device
// current and peak byte counters are kept for everything allocated here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "engine/device.h"

namespace loom {

class Storage {
 public:
  // Takes ownership: release(ptr) runs when the last reference goes.
  Storage(void* ptr, size_t nbytes, Device device, std::function<void(void*)> release, bool pinned = false)
      : ptr_(ptr), nbytes_(nbytes), device_(device), release_(std::move(release)), pinned_(pinned) {}
  ~Storage() {
    if (release_) release_(ptr_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return ptr_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }
  // Memory Loom does not own (borrow(): a mapped file, a caller's buffer): never written in place
  // by an optimisation that assumes a sole owner (autograd's Node::take_grad_so_far).
  bool borrowed() const { return borrowed_; }
  // Allocated while a LongLivedPoolScope lived (the long-lived pool on a GPU): a tensor made there for
  // a leaf's gradient may become that gradient as it is (autograd's accumulate_grad), not copied.
  bool long_lived() const { return long_lived_; }

 private:
  friend std::shared_ptr<Storage> borrow(void*, size_t, Device, std::shared_ptr<const void>);
  friend std::shared_ptr<Storage> allocate(Device, size_t);
  void* ptr_;
  size_t nbytes_;
  Device device_;
  std::function<void(void*)> release_;
  bool pinned_;
  bool borrowed_ = false;
  bool long_lived_ = false;
};

// Allocates nbytes on device: CPU memory 64-byte aligned; CUDA memory from the device's
// stream-ordered pool, ordered on its compute stream (freed there too).
std::shared_ptr<Storage> allocate(Device device, size_t nbytes);
// While one lives on a thread, that thread's CUDA allocations come from a second stream-ordered pool
// of their device, kept for tensors that outlive the layer that makes them: leaf gradients (made in
// backward among the recomputed activations, held until the optimizer step), checkpointed layer
// inputs, the kept buffer of dequantised experts. In the main pool they left holes that its next
// large blocks could not use: on the H200 the Qwen3-30B-A3B 24-layer QLoRA offload row reserved
// 16.91 GiB there for 14.72 GiB in use; with leaf gradients in their own pool, 15.72 (session 34).
// Their sizes come back step after step. CPU: no effect.
class LongLivedPoolScope {
 public:
  LongLivedPoolScope();
  ~LongLivedPoolScope();
  LongLivedPoolScope(const LongLivedPoolScope&) = delete;
  LongLivedPoolScope& operator=(const LongLivedPoolScope&) = delete;

 private:
  bool previous_;
};
// Page-locked host memory (falls back to ordinary memory in a CPU-only build).
std::shared_ptr<Storage> allocate_pinned(size_t nbytes);
// The size of the pinned block allocate_pinned makes for nbytes: up to 4 KiB the size itself, above
// it rounded up to a sixteenth of its largest power of two (at most 6.25 % more), so that sizes that
// differ a little from step to step share the cached blocks. A cached block of that size up to 4 times
// it is taken first.
size_t pinned_block_size(size_t nbytes);
// Returns the pinned blocks kept for reuse (allocate_pinned caches them by size) to the driver;
// the bytes released. Called at exit, and by whoever knows those sizes will not come back.
size_t release_cached_pinned_memory();
// Wraps memory Loom does not own (e.g. a mapped file); keepalive is held until the storage dies.
std::shared_ptr<Storage> borrow(void* ptr, size_t nbytes, Device device, std::shared_ptr<const void> keepalive);

struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
};
MemoryStats memory_stats(Device device);
// The most a CUDA device's stream-ordered pools have held from the driver since the last
// reset_peak_memory (PyTorch's max_memory_reserved): what nvidia-smi sees beyond the context, used or
// cached; the main pool's high-water mark plus the long-lived pool's (whose sizes are the same every
// step). -1 for the CPU or a CPU-only build.
int64_t pool_reserved_peak_bytes(Device device);
// The long-lived pool's bytes (LongLivedPoolScope): those tensors use, and those it holds from the driver
// (both 0 before its first allocation, for the CPU, or in a CPU-only build).
struct PoolBytes {
  int64_t used = 0, reserved = 0;
};
PoolBytes long_lived_pool_bytes(Device device);
// Bytes a new allocation on `device` can still get: the driver's free memory plus what the
// stream-ordered pool holds but no tensor uses. A CPU device: MemAvailable from /proc/meminfo.
int64_t device_available_bytes(Device device);
// Resets the peak byte counter (and a CUDA pool's reserved high-water mark) to the current value.
void reset_peak_memory(Device device);

}  // namespace loom
