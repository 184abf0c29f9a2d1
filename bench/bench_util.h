// Shared pieces of loom_bench: the per-process CUDA context and measured roofline, device buffers
// filled with random values, and run_timed(), which times a launcher with CUDA events.
#pragma once
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common.h"
#include "kernels/cuda_check.h"
#include "kernels/error.h"
#include "kernels/gemm.h"
#include "kernels/grouped_gemm.h"


namespace loom::bench {

// What the hardware did in this process at start-up (bench_main.cpp measures it once).
struct Roofline {
  double copy_bytes_per_s = 0;  // device-to-device cudaMemcpy, bytes read + written per second
  double gemm_flop_per_s = 0;   // bf16 8192^3 loom::cuda::gemm
};

struct BenchContext {
  Stream stream = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  cublasHandle_t cublas = nullptr;  // grouped GEMMs (bound to `stream` and gemm_ws on first use)
  GemmWorkspace gemm_ws;
  int sm_count = 0;
  float* reduce_ws = nullptr;  // kReduceWorkspaceFloats floats for the reductions
  Roofline roof;
};
BenchContext& ctx();

// Owning device allocation of n elements of T (cudaMalloc; freed on destruction).
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    void* p = nullptr;
    LOOM_CUDA_CHECK(cudaMalloc(&p, (n > 0 ? n : 1) * sizeof(T)));
    p_ = static_cast<T*>(p);
  }
  ~DeviceArray() {
    if (p_) cudaFree(p_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Uniform values in [lo, hi) from Loom's Philox fill, on ctx().stream (never zeros: a kernel that
// skips work on zeros would look fast). Each call draws from a new counter range.
void random_fill(float* p, size_t n, float lo = -1.f, float hi = 1.f);
void random_fill(bf16* p, size_t n, float lo = -1.f, float hi = 1.f);
template <class T>
DeviceArray<T> random_array(size_t n, float lo = -1.f, float hi = 1.f) {
  DeviceArray<T> a(n);
  random_fill(a.get(), n, lo, hi);
  return a;
}
// Uniform integers in [0, bound) generated on the host (std::mt19937_64, fixed seed) and copied.
DeviceArray<int32_t> random_ints(size_t n, int32_t bound, uint64_t seed);
DeviceArray<int32_t> upload_ints(const std::vector<int32_t>& v);
DeviceArray<float> upload_floats(const std::vector<float>& v);

// The minimal traffic or arithmetic of one launch: each input read once, each output written once.
enum class Bound { kMemory, kCompute };
struct Work {
  double bytes = 0;  // for kMemory: compared against the copy bandwidth
  double flops = 0;  // for kCompute: compared against the GEMM rate
  Bound bound = Bound::kMemory;
};

// Warm-up, then batches of launches between two CUDA events on ctx().stream; each batch is long
// enough (~2 ms) that the launch latency of the first launch does not count. Sets the manual time,
// counters bytes_per_second / flops_per_second (rates) and pct_of_roofline, and a label naming
// the roofline used ("mem" or "gemm").
void run_timed(benchmark::State& state, const Work& work, const std::function<void()>& launch);

// Registers fn under `name` with manual time; a loom::Error or CUDA error skips the benchmark with
// its message instead of ending the process.
benchmark::internal::Benchmark* add(const std::string& name, std::function<void(benchmark::State&)> fn);

// Size helpers for names: 134217728 -> "128Mi", 4096 -> "4096".
std::string size_name(int64_t n);

// Registration of each family (one file each).
void register_elementwise();
void register_gemm();
void register_grouped_gemm();  // MoE expert GEMMs: cuBLAS's grouped call vs the per-expert loop
void register_nn();         // rms_norm, rope, swiglu/geglu, embedding
void register_attention();  // attention, cross_entropy
void register_loss();       // fused linear + cross-entropy
void register_optim();      // adamw, uniform/normal fills
void register_quant();      // nf4 dequantise / quantise
void register_moe();        // MoE routing, aux loss, dispatch, combine
void register_lora();       // the LoRA backward's products of dy

}  // namespace loom::bench
