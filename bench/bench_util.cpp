// loom_bench helpers: random device data, CUDA-event timing with batched launches, counters
// against the measured roofline, and registration that turns errors into skipped benchmarks.
#include "bench/bench_util.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <random>

#include "kernels/philox.h"

namespace loom::bench {

BenchContext& ctx() {
  static BenchContext c;
  return c;
}

namespace {
uint64_t g_philox_offset = 0;  // next unused Philox counter: every fill gets fresh numbers
constexpr uint64_t kSeed = 0x5eedb0b;
constexpr double kTargetBatchSeconds = 2e-3;
constexpr int64_t kMaxBatch = 256;

template <class T>
void fill_impl(T* p, size_t n, float lo, float hi) {
  cuda::uniform_fill<T>(p, static_cast<int64_t>(n), kSeed, g_philox_offset, lo, hi, ctx().stream);
  g_philox_offset += (n + 3) / 4;
}

// Two events on the benchmark stream, destroyed with the scope.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    LOOM_CUDA_CHECK(cudaEventCreate(&start));
    LOOM_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  // Seconds taken by `count` launches enqueued between the two events.
  double time(const std::function<void()>& launch, int64_t count) {
    Stream s = ctx().stream;
    LOOM_CUDA_CHECK(cudaEventRecord(start, s));
    for (int64_t i = 0; i < count; ++i) launch();
    LOOM_CUDA_CHECK(cudaEventRecord(stop, s));
    LOOM_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return 1e-3 * ms;
  }
};
}  // namespace

void random_fill(float* p, size_t n, float lo, float hi) { fill_impl(p, n, lo, hi); }
void random_fill(bf16* p, size_t n, float lo, float hi) { fill_impl(p, n, lo, hi); }

DeviceArray<int32_t> random_ints(size_t n, int32_t bound, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, bound - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(gen);
  return upload_ints(v);
}

DeviceArray<int32_t> upload_ints(const std::vector<int32_t>& v) {
  DeviceArray<int32_t> a(v.size());
  LOOM_CUDA_CHECK(cudaMemcpy(a.get(), v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  return a;
}

DeviceArray<float> upload_floats(const std::vector<float>& v) {
  DeviceArray<float> a(v.size());
  LOOM_CUDA_CHECK(cudaMemcpy(a.get(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  return a;
}

namespace {
// The benchmark add() is running (its registered name), and the batch each one was given: a
// benchmark's repetitions must run the same number of iterations (Google Benchmark's statistics
// check it), so the batch is sized on the first repetition only.
thread_local const std::string* t_running = nullptr;
std::map<std::string, int64_t>& batch_sizes() {
  static std::map<std::string, int64_t> sizes;
  return sizes;
}
}  // namespace

void run_timed(benchmark::State& state, const Work& work, const std::function<void()>& launch) {
  EventPair ev;
  // Warm-up: the first launch pays for module loading, cuBLASLt heuristics and cold TLBs; the
  // second, timed alone, sizes the batch (once per benchmark, see batch_sizes).
  launch();
  LOOM_CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
  const double one = ev.time(launch, 1);
  int64_t batch =
      std::clamp<int64_t>(static_cast<int64_t>(std::ceil(kTargetBatchSeconds / std::max(one, 1e-7))), 1, kMaxBatch);
  if (t_running) batch = batch_sizes().try_emplace(*t_running, batch).first->second;

  double total_s = 0;
  int64_t launches = 0;
  while (state.KeepRunningBatch(batch)) {
    const double t = ev.time(launch, batch);
    state.SetIterationTime(t);  // the batch counts as `batch` iterations: reported time is per launch
    total_s += t;
    launches += batch;
  }
  LOOM_CUDA_CHECK(cudaGetLastError());

  using benchmark::Counter;
  if (work.bytes > 0) state.counters["bytes_per_second"] = Counter(work.bytes, Counter::kIsIterationInvariantRate);
  if (work.flops > 0) state.counters["flops_per_second"] = Counter(work.flops, Counter::kIsIterationInvariantRate);
  const double per_launch = launches > 0 ? total_s / static_cast<double>(launches) : 0.0;
  const Roofline& roof = ctx().roof;
  double pct = 0;
  if (per_launch > 0) {
    if (work.bound == Bound::kMemory && roof.copy_bytes_per_s > 0) {
      pct = 100.0 * work.bytes / per_launch / roof.copy_bytes_per_s;
    } else if (work.bound == Bound::kCompute && roof.gemm_flop_per_s > 0) {
      pct = 100.0 * work.flops / per_launch / roof.gemm_flop_per_s;
    }
  }
  state.counters["pct_of_roofline"] = Counter(pct);
  state.SetLabel(work.bound == Bound::kMemory ? "mem" : "gemm");
}

benchmark::internal::Benchmark* add(const std::string& name, std::function<void(benchmark::State&)> fn) {
  auto* b = benchmark::RegisterBenchmark(name.c_str(), [name, fn = std::move(fn)](benchmark::State& state) {
    t_running = &name;
    try {
      fn(state);
      t_running = nullptr;
    } catch (const std::exception& e) {
      t_running = nullptr;
      // A CUDA fault is sticky: later benchmarks will fail too, and say so.
      state.SkipWithError(e.what());
    }
  });
  return b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

std::string size_name(int64_t n) {
  if (n >= (int64_t(1) << 20) && n % (int64_t(1) << 20) == 0) return std::to_string(n >> 20) + "Mi";
  return std::to_string(n);
}

}  // namespace loom::bench
