// engine/stream_mark.h: CUDA events with timing on the compute stream, or host clock readings.
#include "engine/stream_mark.h"

#include <chrono>

#include "engine/cuda_context.h"
#include "kernels/error.h"

#if LOOM_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#endif

namespace loom {

struct StreamMark::Impl {
  int device = -1;  // -1: a host clock mark
  std::chrono::steady_clock::time_point host;
#if LOOM_WITH_CUDA
  cudaEvent_t event = nullptr;
  ~Impl() {
    if (event) cudaEventDestroy(event);
  }
#endif
};

StreamMark StreamMark::record(Device device) {
  StreamMark m;
  m.impl_ = std::make_shared<Impl>();
  m.impl_->host = std::chrono::steady_clock::now();
#if LOOM_WITH_CUDA
  if (device.is_cuda()) {
    CudaDeviceGuard guard(device.index);
    m.impl_->device = device.index;
    LOOM_CUDA_CHECK(cudaEventCreate(&m.impl_->event));
    LOOM_CUDA_CHECK(cudaEventRecord(m.impl_->event, CudaContext::get(device.index).stream));
  }
#endif
  return m;
}

double StreamMark::elapsed_ms(const StreamMark& earlier, const StreamMark& later) {
  LOOM_CHECK(earlier.recorded() && later.recorded(), "StreamMark::elapsed_ms: a mark was never recorded");
  LOOM_CHECK(earlier.impl_->device == later.impl_->device, "StreamMark::elapsed_ms: marks on devices ",
             earlier.impl_->device, " and ", later.impl_->device);
#if LOOM_WITH_CUDA
  if (later.impl_->event) {
    LOOM_CUDA_CHECK(cudaEventSynchronize(later.impl_->event));
    float ms = 0.f;
    LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, earlier.impl_->event, later.impl_->event));
    return ms;
  }
#endif
  return std::chrono::duration<double, std::milli>(later.impl_->host - earlier.impl_->host).count();
}

}  // namespace loom
