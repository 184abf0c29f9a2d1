// loom_bench entry point: creates the stream, cuBLAS(Lt) handles and workspaces, measures the roofline
// once (device-to-device copy bandwidth, bf16 8192^3 GEMM rate), prints it in the benchmark
// context, registers one benchmark per CUDA kernel launcher and runs them.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include "bench/bench_util.h"
#include "kernels/elementwise.h"

namespace loom::bench {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

void create_context(int device) {
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  BenchContext& c = ctx();
  cudaStream_t s = nullptr;
  // A blocking stream: the synchronous cudaMemcpy uploads on the legacy default stream are ordered
  // before the kernels that read them.
  LOOM_CUDA_CHECK(cudaStreamCreate(&s));
  c.stream = s;
  LOOM_CHECK(cublasLtCreate(&c.cublaslt) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate failed");
  LOOM_CHECK(cublasCreate(&c.cublas) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed");
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&c.sm_count, cudaDevAttrMultiProcessorCount, device));
  LOOM_CUDA_CHECK(cudaMalloc(&c.gemm_ws.ptr, kGemmWorkspaceBytes));
  c.gemm_ws.bytes = kGemmWorkspaceBytes;
  void* r = nullptr;
  LOOM_CUDA_CHECK(cudaMalloc(&r, cuda::kReduceWorkspaceFloats * sizeof(float)));
  c.reduce_ws = static_cast<float*>(r);
}

// Best of several batches of `reps` launches, in seconds per launch.
double best_seconds(const std::function<void()>& launch, int reps, int batches) {
  cudaEvent_t a, b;
  LOOM_CUDA_CHECK(cudaEventCreate(&a));
  LOOM_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch();  // warm-up
  double best = 1e30;
  for (int j = 0; j < batches; ++j) {
    LOOM_CUDA_CHECK(cudaEventRecord(a, ctx().stream));
    for (int i = 0; i < reps; ++i) launch();
    LOOM_CUDA_CHECK(cudaEventRecord(b, ctx().stream));
    LOOM_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, 1e-3 * ms / reps);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

// A 1 GiB device-to-device copy reads and writes 1 GiB: 2 GiB of traffic per launch.
double measure_copy_bandwidth() {
  const size_t bytes = size_t(1) << 30;
  DeviceArray<uint8_t> src(bytes), dst(bytes);
  LOOM_CUDA_CHECK(cudaMemsetAsync(src.get(), 0x5a, bytes, ctx().stream));
  const double t = best_seconds(
      [&] { LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, ctx().stream)); },
      10, 5);
  return 2.0 * static_cast<double>(bytes) / t;
}

// C[8192, 8192] = A[8192, 8192] B[8192, 8192], bf16 in and out, f32 accumulation, Loom's cuBLASLt path.
double measure_gemm_rate() {
  const int64_t n = 8192;
  auto a = random_array<bf16>(n * n), b = random_array<bf16>(n * n);
  DeviceArray<bf16> c(n * n);
  GemmArgs g;
  g.m = g.n = g.k = n;
  g.a = a.get(), g.lda = n;
  g.b = b.get(), g.ldb = n;
  g.c = c.get(), g.ldc = n;
  g.ab_type = g.c_type = GemmType::kBF16;
  const BenchContext& x = ctx();
  const double t = best_seconds([&] { cuda::gemm(g, x.cublaslt, x.gemm_ws, x.stream); }, 10, 5);
  return 2.0 * double(n) * double(n) * double(n) / t;
}

void add_device_context(int device) {
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  benchmark::AddCustomContext("gpu", prop.name);
  benchmark::AddCustomContext("gpu_sms", std::to_string(prop.multiProcessorCount));
  benchmark::AddCustomContext("gpu_memory_GiB", fmt("%.1f", double(prop.totalGlobalMem) / double(1 << 30)));
  benchmark::AddCustomContext("gpu_l2_MiB", fmt("%.1f", double(prop.l2CacheSize) / double(1 << 20)));
  benchmark::AddCustomContext("cuda_runtime", std::to_string(runtime));
  benchmark::AddCustomContext("cuda_driver", std::to_string(driver));
}

// Creates the context and measures the roofline; false (after printing why) when there is no GPU.
bool setup() {
  try {
    create_context(0);
    add_device_context(0);
    Roofline& roof = ctx().roof;
    roof.copy_bytes_per_s = measure_copy_bandwidth();
    roof.gemm_flop_per_s = measure_gemm_rate();
    benchmark::AddCustomContext("roofline_copy_GBps", fmt("%.1f", roof.copy_bytes_per_s * 1e-9));
    benchmark::AddCustomContext("roofline_gemm_bf16_TFLOPs", fmt("%.1f", roof.gemm_flop_per_s * 1e-12));
    std::fprintf(stderr, "loom_bench roofline: copy %.1f GB/s (read + write), bf16 8192^3 GEMM %.1f TFLOP/s\n",
                 roof.copy_bytes_per_s * 1e-9, roof.gemm_flop_per_s * 1e-12);
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom_bench: setup failed: %s\n", e.what());
    return false;
  }
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  using namespace loom::bench;
  // Listing the names needs no GPU (and works on a machine without one).
  bool list_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    list_only |= a == "--benchmark_list_tests" || a == "--benchmark_list_tests=true";
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!list_only && !setup()) return 1;
  register_elementwise();
  register_gemm();
  register_grouped_gemm();
  register_nn();
  register_attention();
  register_loss();
  register_optim();
  register_quant();
  register_moe();
  register_lora();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
