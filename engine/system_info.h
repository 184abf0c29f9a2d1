// What `loom doctor` reports of the machine: the CPU (model, cores, the instruction sets the CPU
// kernels can use) and each GPU (name, compute capability, memory, driver and runtime, peer access).
// A CPU-only build sees no GPU.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

struct CpuInfo {
  std::string model;            // /proc/cpuinfo "model name" ("" when unknown)
  int logical_cpus = 0;         // usable by this process (its affinity mask)
  std::vector<std::string> isa; // of avx2, fma, avx512f, avx512_bf16, amx_tile, amx_bf16 that the CPU has
  std::vector<std::string> built_for;  // the same sets the compiler was allowed to emit (-march)
};
CpuInfo cpu_info();

struct GpuInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;     // compute capability
  int64_t total_bytes = 0, free_bytes = 0;
  std::vector<int> peers;       // GPUs this one can access directly
};
std::vector<GpuInfo> gpu_info();
int cuda_driver_version();   // e.g. 13000; 0 when there is no driver or no CUDA in this build
int cuda_runtime_version();  // the runtime Loom was linked with; 0 without CUDA
bool built_with_cuda();

}  // namespace loom
