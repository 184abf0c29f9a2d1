// Activation offload (see offload.h): pinned blocks reused by size, one side stream per device,
// and a list of in-flight copies whose memory is released only once the copy is known done.
#include "engine/offload.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/cuda_context.h"
#include "engine/memory.h"
#include "kernels/error.h"
#if LOOM_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#endif

namespace loom {
namespace {

std::atomic<int64_t> g_budget{-1};
std::atomic<int> g_sharers{1};
std::atomic<int64_t> g_host_bytes{0}, g_peak_host_bytes{0}, g_kept{0};

int64_t mem_available_bytes() {
  const int64_t b = device_available_bytes(Device::cpu());
  return b > 0 ? b : int64_t(16) << 30;  // no /proc/meminfo: assume 16 GiB
}

int64_t budget() {
  int64_t b = g_budget.load();
  if (b < 0) {
    b = mem_available_bytes() / 5 * 4 / std::max(1, g_sharers.load());
    g_budget.store(b);
  }
  return b;
}

[[maybe_unused]] void count_host(int64_t delta) {  // (CUDA builds only)
  const int64_t now = g_host_bytes.fetch_add(delta) + delta;
  int64_t peak = g_peak_host_bytes.load();
  while (now > peak && !g_peak_host_bytes.compare_exchange_weak(peak, now)) {
  }
}

}  // namespace

std::shared_ptr<OffloadedTensor> OffloadedTensor::keep(const Tensor& t) {
  std::shared_ptr<OffloadedTensor> o(new OffloadedTensor());
  o->device_ = t;
  return o;
}

void set_offload_host_budget(int64_t bytes) { g_budget.store(bytes < 0 ? -1 : bytes); }
void set_offload_host_sharers(int processes) {
  g_sharers.store(std::max(1, processes));
  g_budget.store(-1);  // the default again, made with the new share at the next offload
}
int64_t offload_host_room() { return std::max<int64_t>(budget() - g_host_bytes.load(), 0); }
OffloadStats offload_stats() { return {g_host_bytes.load(), g_peak_host_bytes.load(), g_kept.load()}; }
void reset_offload_peak() { g_peak_host_bytes.store(g_host_bytes.load()); }

#if LOOM_WITH_CUDA

struct OffloadedTensor::Event {
  cudaEvent_t e = nullptr;
  Event() { LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
  ~Event() { cudaEventDestroy(e); }
};

namespace {

// Per device: the side stream for copies both ways.
cudaStream_t side_stream(int device) {
  static std::mutex mu;
  static std::map<int, cudaStream_t> streams;
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams.find(device);
  if (it != streams.end()) return it->second;
  CudaDeviceGuard guard(device);
  cudaStream_t s;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  streams[device] = s;
  return s;
}

cudaStream_t compute_stream(int device) { return static_cast<cudaStream_t>(CudaContext::get(device).stream); }

// Orders `waiter` after everything queued on `stream` so far.
void order_after(cudaStream_t waiter, cudaStream_t stream) {
  cudaEvent_t e;
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  LOOM_CUDA_CHECK(cudaEventRecord(e, stream));
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(waiter, e, 0));
  LOOM_CUDA_CHECK(cudaEventDestroy(e));  // its resources go once the wait is satisfied
}

// Memory an in-flight copy still touches, released once the copy is known complete. A device
// block whose copy is not complete yet is released only after the compute stream has been made to
// wait for that copy, so the stream-ordered pool cannot hand it out while the copy still reads it.
struct InFlight {
  Tensor keep;
  std::shared_ptr<OffloadedTensor::Event> done;
};
std::mutex g_inflight_mu;
std::vector<InFlight> g_inflight;

void reap(bool wait_for_device_blocks) {
  std::lock_guard<std::mutex> lock(g_inflight_mu);
  std::vector<InFlight> still;
  for (auto& f : g_inflight) {
    const cudaError_t q = cudaEventQuery(f.done->e);
    if (q == cudaSuccess) continue;
    if (q != cudaErrorNotReady) LOOM_CUDA_CHECK(q);
    (void)cudaGetLastError();  // cudaErrorNotReady is not sticky, but clear it anyway
    if (wait_for_device_blocks && f.keep.is_cuda()) {
      LOOM_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(f.keep.device().index), f.done->e, 0));
      continue;
    }
    still.push_back(std::move(f));
  }
  g_inflight = std::move(still);
}

void defer(Tensor keep, std::shared_ptr<OffloadedTensor::Event> done) {
  std::lock_guard<std::mutex> lock(g_inflight_mu);
  g_inflight.push_back({std::move(keep), std::move(done)});
}

}  // namespace

std::shared_ptr<OffloadedTensor> OffloadedTensor::offload(const Tensor& t) { return copy_down(t, false); }

std::shared_ptr<OffloadedTensor> OffloadedTensor::offload_or_drop(const Tensor& t) { return copy_down(t, true); }

std::shared_ptr<OffloadedTensor> OffloadedTensor::copy_down(const Tensor& t, bool optional) {
  std::shared_ptr<OffloadedTensor> o(new OffloadedTensor());
  o->device_ = t;
  if (!t.is_cuda()) return o;
  // The previous layer's copy down has had this layer's forward to finish: order the compute
  // stream after it and let its device block go. (Not for an optional copy mid-layer: the copies
  // queued just before it, this layer's input's among them, cannot have finished.)
  reap(/*wait_for_device_blocks=*/!optional);
  if (g_host_bytes.load() + static_cast<int64_t>(t.nbytes()) > budget()) {
    if (optional) return nullptr;
    g_kept.fetch_add(1);
    return o;
  }
  const int dev = t.device().index;
  CudaDeviceGuard guard(dev);
  const Tensor src = t.contiguous();
  o->device_index_ = dev;
  o->host_ = Tensor::from_storage(allocate_pinned(src.nbytes()), src.shape(), src.dtype());
  count_host(src.nbytes());
  cudaStream_t side = side_stream(dev);
  order_after(side, compute_stream(dev));
  LOOM_CUDA_CHECK(cudaMemcpyAsync(o->host_.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToHost, side));
  o->down_ = std::make_shared<Event>();
  LOOM_CUDA_CHECK(cudaEventRecord(o->down_->e, side));
  defer(src, o->down_);  // the source block lives until the copy down is done
  o->device_ = Tensor();
  o->on_host_ = true;
  return o;
}

void OffloadedTensor::prefetch() {
  if (!on_host_ || fetching_) return;
  CudaDeviceGuard guard(device_index_);
  cudaStream_t side = side_stream(device_index_);
  device_ = Tensor::empty(host_.shape(), host_.dtype(), Device::cuda(device_index_));  // ordered on compute
  order_after(side, compute_stream(device_index_));  // after the allocation (and after the copy down)
  LOOM_CUDA_CHECK(cudaMemcpyAsync(device_.data_ptr(), host_.data_ptr(), host_.nbytes(), cudaMemcpyHostToDevice, side));
  up_ = std::make_shared<Event>();
  LOOM_CUDA_CHECK(cudaEventRecord(up_->e, side));
  fetching_ = true;
}

Tensor OffloadedTensor::fetch() {
  if (!on_host_) return device_;
  prefetch();
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(device_index_), up_->e, 0));
  count_host(-host_.nbytes());
  defer(host_, up_);  // the pinned block goes back to the cache once the copy up is done
  host_ = Tensor();
  on_host_ = false;
  reap(/*wait_for_device_blocks=*/false);
  return device_;
}

OffloadedTensor::~OffloadedTensor() {
  if (!host_.defined()) return;
  count_host(-host_.nbytes());
  if (up_ || down_) defer(host_, up_ ? up_ : down_);  // a copy may still use the block
  // Copied back but never fetched (an exception between a prefetch and its use): the copy up may
  // still write the device block.
  if (fetching_ && device_.defined()) defer(device_, up_);
}

#else  // CPU-only build: nothing leaves the host.

struct OffloadedTensor::Event {};

std::shared_ptr<OffloadedTensor> OffloadedTensor::offload(const Tensor& t) { return copy_down(t, false); }
std::shared_ptr<OffloadedTensor> OffloadedTensor::offload_or_drop(const Tensor& t) { return copy_down(t, true); }
std::shared_ptr<OffloadedTensor> OffloadedTensor::copy_down(const Tensor& t, bool) {
  std::shared_ptr<OffloadedTensor> o(new OffloadedTensor());
  o->device_ = t;
  return o;
}
void OffloadedTensor::prefetch() {}
Tensor OffloadedTensor::fetch() { return device_; }
OffloadedTensor::~OffloadedTensor() = default;

#endif

}  // namespace loom
