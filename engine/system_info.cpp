// See system_info.h.
#include "engine/system_info.h"

#include <sched.h>

#include <fstream>
#include <set>
#include <sstream>

#include "kernels/common.h"
#if LOOM_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace loom {

CpuInfo cpu_info() {
  CpuInfo c;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) c.logical_cpus = CPU_COUNT(&set);
  std::ifstream f("/proc/cpuinfo");
  std::set<std::string> flags;
  for (std::string line; std::getline(f, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && c.model.empty()) c.model = value;
    if (key == "flags" && flags.empty()) {
      std::istringstream in(value);
      for (std::string w; in >> w;) flags.insert(w);
    }
  }
  for (const char* s : {"avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
    if (flags.count(s)) c.isa.push_back(s);
#ifdef __AVX2__
  c.built_for.push_back("avx2");
#endif
#ifdef __FMA__
  c.built_for.push_back("fma");
#endif
#ifdef __AVX512F__
  c.built_for.push_back("avx512f");
#endif
#ifdef __AVX512BF16__
  c.built_for.push_back("avx512_bf16");
#endif
#ifdef __AMX_TILE__
  c.built_for.push_back("amx_tile");
#endif
  return c;
}

bool built_with_cuda() { return LOOM_WITH_CUDA != 0; }

std::vector<GpuInfo> gpu_info() {
  std::vector<GpuInfo> out;
#if LOOM_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return out;
  }
  int current = 0;
  cudaGetDevice(&current);
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    GpuInfo g;
    g.index = i;
    g.name = p.name;
    g.major = p.major, g.minor = p.minor;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      g.free_bytes = static_cast<int64_t>(free_b), g.total_bytes = static_cast<int64_t>(total_b);
    for (int j = 0; j < n; ++j) {
      int can = 0;
      if (j != i && cudaDeviceCanAccessPeer(&can, i, j) == cudaSuccess && can) g.peers.push_back(j);
    }
    out.push_back(g);
  }
  cudaSetDevice(current);
  cudaGetLastError();
#endif
  return out;
}

int cuda_driver_version() {
  int v = 0;
#if LOOM_WITH_CUDA
  if (cudaDriverGetVersion(&v) != cudaSuccess) v = 0;
#endif
  return v;
}

int cuda_runtime_version() {
  int v = 0;
#if LOOM_WITH_CUDA
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) v = 0;
#endif
  return v;
}

}  // namespace loom
