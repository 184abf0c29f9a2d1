// Allocators and per-device byte counters (see memory.h).
#include "engine/memory.h"

#include <array>
#include <atomic>
#include <cstdlib>

#include "engine/cuda_context.h"
#include "kernels/error.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda_check.h"
#endif

namespace loom {
namespace {

constexpr int kMaxCudaDevices = 64;
struct Counter {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
};
Counter& counter(Device d) {
  static Counter cpu;
  static std::array<Counter, kMaxCudaDevices> cuda;
  if (d.is_cpu()) return cpu;
  LOOM_CHECK(d.index >= 0 && d.index < kMaxCudaDevices, "device index out of range: ", d.index);
  return cuda[d.index];
}
void count_alloc(Device d, int64_t n) {
  Counter& c = counter(d);
  const int64_t now = c.current.fetch_add(n) + n;
  int64_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
}
void count_free(Device d, int64_t n) { counter(d).current.fetch_sub(n); }

constexpr size_t kHostAlignment = 64;

}  // namespace

std::shared_ptr<Storage> allocate(Device device, size_t nbytes) {
  if (device.is_cpu()) {
    const size_t rounded = (std::max<size_t>(nbytes, 1) + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    void* p = std::aligned_alloc(kHostAlignment, rounded);
    LOOM_CHECK(p != nullptr, "out of host memory allocating ", nbytes, " bytes");
    count_alloc(device, static_cast<int64_t>(nbytes));
    return std::make_shared<Storage>(p, nbytes, device, [device, nbytes](void* q) {
      std::free(q);
      count_free(device, static_cast<int64_t>(nbytes));
    });
  }
#if LOOM_WITH_CUDA
  CudaContext& ctx = CudaContext::get(device.index);
  CudaDeviceGuard guard(device.index);
  void* p = nullptr;
  if (nbytes > 0) {
    cudaError_t err = cudaMallocAsync(&p, nbytes, ctx.stream);
    if (err != cudaSuccess) {
      cudaGetLastError();
      LOOM_CHECK(false, "CUDA out of memory on cuda:", device.index, " allocating ", nbytes, " bytes (",
                 memory_stats(device).current_bytes, " bytes in use by Loom): ", cudaGetErrorString(err));
    }
  }
  count_alloc(device, static_cast<int64_t>(nbytes));
  cudaStream_t stream = ctx.stream;
  return std::make_shared<Storage>(p, nbytes, device, [device, nbytes, stream](void* q) {
    // Stream-ordered free: safe while earlier work on the compute stream still reads q.
    if (q) {
      CudaDeviceGuard g(device.index);
      cudaFreeAsync(q, stream);
    }
    count_free(device, static_cast<int64_t>(nbytes));
  });
#else
  LOOM_CHECK(false, "Loom was built without CUDA (LOOM_CUDA=OFF); cannot allocate on ", device.str());
  return nullptr;
#endif
}

std::shared_ptr<Storage> allocate_pinned(size_t nbytes) {
#if LOOM_WITH_CUDA
  if (cuda_available()) {
    void* p = nullptr;
    LOOM_CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(nbytes, 1)));
    count_alloc(Device::cpu(), static_cast<int64_t>(nbytes));
    return std::make_shared<Storage>(
        p, nbytes, Device::cpu(),
        [nbytes](void* q) {
          cudaFreeHost(q);
          count_free(Device::cpu(), static_cast<int64_t>(nbytes));
        },
        /*pinned=*/true);
  }
#endif
  return allocate(Device::cpu(), nbytes);
}

std::shared_ptr<Storage> borrow(void* ptr, size_t nbytes, Device device, std::shared_ptr<const void> keepalive) {
  return std::make_shared<Storage>(ptr, nbytes, device, [keepalive](void*) {});
}

MemoryStats memory_stats(Device device) {
  Counter& c = counter(device);
  return {c.current.load(), c.peak.load()};
}

void reset_peak_memory(Device device) {
  Counter& c = counter(device);
  c.peak.store(c.current.load());
}

}  // namespace loom
