// Allocators and per-device byte counters (see memory.h).
#include "engine/memory.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <vector>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

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

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1 << 30));
  return buf;
}

#if LOOM_WITH_CUDA
// What ran out and what Loom holds; the caller, who knows what it was doing, adds what to try
// (e.g. `loom train`: train/checkpointing_plan.h).
std::string out_of_memory_message(Device device, size_t nbytes, const char* cuda_error) {
  const MemoryStats st = memory_stats(device);
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  cudaGetLastError();
  return detail::cat("CUDA out of memory on cuda:", device.index, " allocating ", gib(double(nbytes)), " (", cuda_error,
                     "): Loom holds ", gib(double(st.current_bytes)), " (peak ", gib(double(st.peak_bytes)),
                     ") of the card's ", gib(double(total_b)), ", ", gib(double(free_b)),
                     " free (other processes on this GPU count too: nvidia-smi).");
}
#endif

thread_local bool t_long_lived_pool = false;

#if LOOM_WITH_CUDA
// The device's pools: the default one, and the long-lived pool (LongLivedPoolScope) once it exists
// (else null).
struct DevicePools {
  cudaMemPool_t main = nullptr, long_lived = nullptr;
  template <class F>
  void each(const F& f) const {
    f(main);
    if (long_lived) f(long_lived);
  }
};
// The long-lived pool is created on first use (under a lock, once) and never destroyed (its tensors
// may be freed during exit), freed blocks kept as in the default pool; looked up without a lock.
DevicePools pools_of(int device, bool make_long_lived_pool = false) {
  static std::array<std::atomic<cudaMemPool_t>, kMaxCudaDevices> defaults{}, long_lived{};
  static std::mutex create;
  LOOM_CHECK(device >= 0 && device < kMaxCudaDevices, "device index out of range: ", device);
  DevicePools p;
  p.main = defaults[device].load();
  if (p.main == nullptr) {
    LOOM_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&p.main, device));
    defaults[device] = p.main;
  }
  p.long_lived = long_lived[device].load();
  if (p.long_lived == nullptr && make_long_lived_pool) {
    std::lock_guard<std::mutex> lock(create);
    p.long_lived = long_lived[device].load();
    if (p.long_lived == nullptr) {
      cudaMemPoolProps props = {};
      props.allocType = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = device;
      LOOM_CUDA_CHECK(cudaMemPoolCreate(&p.long_lived, &props));
      uint64_t threshold = UINT64_MAX;
      LOOM_CUDA_CHECK(cudaMemPoolSetAttribute(p.long_lived, cudaMemPoolAttrReleaseThreshold, &threshold));
      long_lived[device] = p.long_lived;
    }
  }
  return p;
}
#endif

}  // namespace

LongLivedPoolScope::LongLivedPoolScope() : previous_(t_long_lived_pool) { t_long_lived_pool = true; }
LongLivedPoolScope::~LongLivedPoolScope() { t_long_lived_pool = previous_; }

std::shared_ptr<Storage> allocate(Device device, size_t nbytes) {
  if (device.is_cpu()) {
    const size_t rounded = (std::max<size_t>(nbytes, 1) + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    void* p = std::aligned_alloc(kHostAlignment, rounded);
    // A limit the user can act on (a smaller model, batch or rank), reported as such.
    if (p == nullptr) throw OutOfMemoryError(detail::cat("out of host memory allocating ", gib(double(nbytes)), "."));
    count_alloc(device, static_cast<int64_t>(nbytes));
    auto s = std::make_shared<Storage>(p, nbytes, device, [device, nbytes](void* q) {
      std::free(q);
      count_free(device, static_cast<int64_t>(nbytes));
    });
    s->long_lived_ = t_long_lived_pool;
    return s;
  }
#if LOOM_WITH_CUDA
  CudaContext& ctx = CudaContext::get(device.index);
  CudaDeviceGuard guard(device.index);
  void* p = nullptr;
  if (nbytes > 0) {
    const DevicePools pools = pools_of(device.index, t_long_lived_pool);
    cudaMemPool_t from = t_long_lived_pool ? pools.long_lived : pools.main;
    cudaError_t err = cudaMallocFromPoolAsync(&p, nbytes, from, ctx.stream);
    if (err == cudaErrorMemoryAllocation) {
      // The pools keep freed blocks (a high release threshold): hand them back to the driver once
      // and retry before giving up, so fragmentation alone never ends a run.
      cudaGetLastError();
      bool trimmed = cudaStreamSynchronize(ctx.stream) == cudaSuccess;
      pools.each([&](cudaMemPool_t pool) { trimmed = trimmed && cudaMemPoolTrimTo(pool, 0) == cudaSuccess; });
      if (trimmed) err = cudaMallocFromPoolAsync(&p, nbytes, from, ctx.stream);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw OutOfMemoryError(out_of_memory_message(device, nbytes, cudaGetErrorString(err)));
    }
  }
  count_alloc(device, static_cast<int64_t>(nbytes));
  cudaStream_t stream = ctx.stream;
  auto s = std::make_shared<Storage>(p, nbytes, device, [device, nbytes, stream](void* q) {
    // Stream-ordered free: safe while earlier work on the compute stream still reads q.
    if (q) {
      CudaDeviceGuard g(device.index);
      cudaFreeAsync(q, stream);
    }
    count_free(device, static_cast<int64_t>(nbytes));
  });
  s->long_lived_ = t_long_lived_pool;
  return s;
#else
  LOOM_CHECK(false, "Loom was built without CUDA (LOOM_CUDA=OFF); cannot allocate on ", device.str());
  return nullptr;
#endif
}

#if LOOM_WITH_CUDA
namespace {
// Pinned blocks are kept for reuse: cudaMallocHost is slow and cudaFreeHost synchronises the
// device, and the same sizes (a step's batch, a layer's input) come back every step, or nearly
// the same ones (a preference batch is padded to its longest pair): blocks come in the sizes of
// pinned_block_size, and a request takes the smallest free block of at least its size and at
// most a quarter more. A released block may be handed out again at once, so a caller must keep a block alive
// while an asynchronous copy still uses it (engine/offload.cpp does; the trainer keeps its batch
// for the whole step).
struct PinnedCache {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free;
  bool closed = false;  // after exit began: released blocks go straight back to the driver
};
PinnedCache& pinned_cache() {
  static auto* c = new PinnedCache();  // never destroyed: blocks may be released during exit
  return *c;
}
// At exit, the cached blocks go back to the driver (compute-sanitizer's leak check counts them).
// Constructed on the first pinned allocation, after the CUDA runtime started, so it runs before
// the runtime's own teardown.
struct PinnedCacheCloser {
  ~PinnedCacheCloser() {
    {
      std::lock_guard<std::mutex> lock(pinned_cache().mu);
      pinned_cache().closed = true;
    }
    release_cached_pinned_memory();
  }
};
}  // namespace
#endif

size_t pinned_block_size(size_t nbytes) {
  const size_t n = std::max<size_t>(nbytes, 1);
  if (n <= 4096) return n;
  size_t top = size_t{1} << (63 - __builtin_clzll(n));  // the largest power of two <= n
  const size_t grain = top / 16;
  return (n + grain - 1) / grain * grain;
}

std::shared_ptr<Storage> allocate_pinned(size_t nbytes) {
#if LOOM_WITH_CUDA
  if (cuda_available()) {
    size_t n = pinned_block_size(nbytes);
    void* p = nullptr;
    PinnedCache& cache = pinned_cache();
    static PinnedCacheCloser closer;
    {
      std::lock_guard<std::mutex> lock(cache.mu);
      // The smallest free block that holds n and is at most 4 times its size: a narrower batch (an epoch's
      // last, train/packing.cpp) reuses the full-width steps' blocks instead of caching a set of its own
      // each new width; kilobyte stagings never take megabyte blocks.
      for (auto it = cache.free.lower_bound(n); it != cache.free.end() && it->first <= 4 * n; ++it)
        if (!it->second.empty()) {
          p = it->second.back();
          it->second.pop_back();
          n = it->first;  // the block's own size: it goes back to its place
          break;
        }
    }
    if (!p) LOOM_CUDA_CHECK(cudaMallocHost(&p, n));
    count_alloc(Device::cpu(), static_cast<int64_t>(nbytes));
    return std::make_shared<Storage>(
        p, nbytes, Device::cpu(),
        [nbytes, n](void* q) {
          count_free(Device::cpu(), static_cast<int64_t>(nbytes));
          PinnedCache& c = pinned_cache();
          std::lock_guard<std::mutex> lock(c.mu);
          if (c.closed) {
            cudaFreeHost(q);  // error ignored: the runtime may be gone already
            return;
          }
          c.free[n].push_back(q);
        },
        /*pinned=*/true);
  }
#endif
  return allocate(Device::cpu(), nbytes);
}

size_t release_cached_pinned_memory() {
  size_t released = 0;
#if LOOM_WITH_CUDA
  PinnedCache& cache = pinned_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  for (auto& [bytes, blocks] : cache.free) {
    for (void* p : blocks) {
      cudaFreeHost(p);  // synchronises the device; errors ignored (also called at exit)
      released += bytes;
    }
  }
  cache.free.clear();
#endif
  return released;
}

std::shared_ptr<Storage> borrow(void* ptr, size_t nbytes, Device device, std::shared_ptr<const void> keepalive) {
  auto s = std::make_shared<Storage>(ptr, nbytes, device, [keepalive](void*) {});
  s->borrowed_ = true;
  return s;
}

MemoryStats memory_stats(Device device) {
  Counter& c = counter(device);
  return {c.current.load(), c.peak.load()};
}

int64_t device_available_bytes(Device device) {
  if (device.is_cpu()) {
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    int64_t kib = 0;
    while (meminfo >> key >> kib) {  // "Key: value [kB]" lines (some have no unit)
      if (key == "MemAvailable:") return kib * 1024;
      meminfo.ignore(1 << 10, '\n');
    }
    return 0;
  }
#if LOOM_WITH_CUDA
  CudaDeviceGuard guard(device.index);
  size_t free_bytes = 0, total = 0;
  LOOM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  int64_t cached = 0;  // held by the pools, used by no tensor
  pools_of(device.index).each([&](cudaMemPool_t pool) {
    uint64_t reserved = 0, used = 0;
    LOOM_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    LOOM_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    cached += static_cast<int64_t>(reserved - std::min(used, reserved));
  });
  return static_cast<int64_t>(free_bytes) + cached;
#else
  return 0;
#endif
}

int64_t pool_reserved_peak_bytes(Device device) {
  if (device.is_cpu()) return -1;
#if LOOM_WITH_CUDA
  CudaDeviceGuard guard(device.index);
  int64_t high = 0;
  pools_of(device.index).each([&](cudaMemPool_t pool) {
    uint64_t h = 0;
    LOOM_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &h));
    high += static_cast<int64_t>(h);
  });
  return high;
#else
  return -1;
#endif
}

PoolBytes long_lived_pool_bytes(Device device) {
  PoolBytes b;
#if LOOM_WITH_CUDA
  if (device.is_cpu()) return b;
  CudaDeviceGuard guard(device.index);
  const cudaMemPool_t pool = pools_of(device.index).long_lived;
  if (pool == nullptr) return b;
  uint64_t used = 0, reserved = 0;
  LOOM_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  LOOM_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  b.used = static_cast<int64_t>(used), b.reserved = static_cast<int64_t>(reserved);
#else
  (void)device;
#endif
  return b;
}

void reset_peak_memory(Device device) {
  Counter& c = counter(device);
  c.peak.store(c.current.load());
#if LOOM_WITH_CUDA
  if (device.is_cuda()) {
    CudaDeviceGuard guard(device.index);
    pools_of(device.index).each([&](cudaMemPool_t pool) {
      uint64_t zero = 0;  // the high-water mark restarts from what the pool holds now
      LOOM_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
    });
  }
#endif
}

}  // namespace loom
