// Side-stream copies between GPU and pinned host memory (see transfer.h).
#include "engine/transfer.h"

#include <map>
#include <mutex>
#include <utility>

#include "engine/cuda_context.h"
#include "kernels/error.h"
#if LOOM_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#endif

namespace loom {
namespace {

void check_pair(const char* op, const Tensor& src, const Tensor& dst) {
  LOOM_CHECK(src.defined() && dst.defined(), op, ": undefined tensor");
  LOOM_CHECK(src.is_contiguous() && dst.is_contiguous(), op, ": needs contiguous tensors, got ", src.str(), " -> ",
             dst.str());
  LOOM_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(), op, ": ", src.str(), " -> ", dst.str(),
             " differ in dtype or size");
}

}  // namespace

#if LOOM_WITH_CUDA

struct TransferEvent::Impl {
  int device = 0;
  cudaEvent_t e = nullptr;
  explicit Impl(int d) : device(d) { LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
  ~Impl() { cudaEventDestroy(e); }
};

namespace {

// Per device: the download (0) and upload (1) streams.
cudaStream_t side_stream(int device, int way) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, cudaStream_t> streams;
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams.find({device, way});
  if (it != streams.end()) return it->second;
  CudaDeviceGuard guard(device);
  cudaStream_t s;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  streams[{device, way}] = s;
  return s;
}

cudaStream_t compute_stream(int device) { return static_cast<cudaStream_t>(CudaContext::get(device).stream); }

// Queues the copy on `way`'s stream of `device` after the compute stream's work so far.
std::shared_ptr<TransferEvent::Impl> queue(int device, int way, void* dst, const void* src, size_t bytes,
                                           cudaMemcpyKind kind) {
  CudaDeviceGuard guard(device);
  cudaStream_t side = side_stream(device, way);
  auto after = std::make_shared<TransferEvent::Impl>(device);
  LOOM_CUDA_CHECK(cudaEventRecord(after->e, compute_stream(device)));
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(side, after->e, 0));
  if (bytes > 0) LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, side));
  auto done = std::make_shared<TransferEvent::Impl>(device);
  LOOM_CUDA_CHECK(cudaEventRecord(done->e, side));
  return done;
}

}  // namespace

void TransferEvent::wait() const {
  if (impl_) LOOM_CUDA_CHECK(cudaEventSynchronize(impl_->e));
}

void TransferEvent::order_compute() const {
  if (!impl_) return;
  CudaDeviceGuard guard(impl_->device);
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(impl_->device), impl_->e, 0));
}

TransferEvent copy_to_host_async(const Tensor& src, Tensor& dst) {
  const char* op = "copy_to_host_async";
  check_pair(op, src, dst);
  LOOM_CHECK(dst.is_cpu(), op, ": destination ", dst.str(), " is not on the host");
  TransferEvent ev;
  if (src.is_cpu()) {
    dst.copy_(src);
    return ev;
  }
  LOOM_CHECK(dst.storage()->pinned(), op, ": destination ", dst.str(), " must be pinned for an asynchronous copy");
  ev.impl_ = queue(src.device().index, 0, dst.data_ptr(), src.data_ptr(), static_cast<size_t>(src.nbytes()),
                   cudaMemcpyDeviceToHost);
  return ev;
}

TransferEvent copy_to_device_async(const Tensor& src, Tensor& dst) {
  const char* op = "copy_to_device_async";
  check_pair(op, src, dst);
  LOOM_CHECK(src.is_cpu(), op, ": source ", src.str(), " is not on the host");
  TransferEvent ev;
  if (dst.is_cpu()) {
    dst.copy_(src);
    return ev;
  }
  LOOM_CHECK(src.storage()->pinned(), op, ": source ", src.str(), " must be pinned for an asynchronous copy");
  ev.impl_ = queue(dst.device().index, 1, dst.data_ptr(), src.data_ptr(), static_cast<size_t>(src.nbytes()),
                   cudaMemcpyHostToDevice);
  return ev;
}

#else  // CPU-only build: every tensor is on the host.

struct TransferEvent::Impl {};

void TransferEvent::wait() const {}
void TransferEvent::order_compute() const {}

TransferEvent copy_to_host_async(const Tensor& src, Tensor& dst) {
  check_pair("copy_to_host_async", src, dst);
  dst.copy_(src);
  return {};
}

TransferEvent copy_to_device_async(const Tensor& src, Tensor& dst) {
  check_pair("copy_to_device_async", src, dst);
  dst.copy_(src);
  return {};
}

#endif

}  // namespace loom
