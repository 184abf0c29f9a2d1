// What CPU optimizer offload moves off the GPU (see optimizer_memory.h).
#include "train/optimizer_memory.h"

#include <cstdio>

#include "absl/strings/str_format.h"

namespace loom {

int64_t offloaded_gpu_bytes(const optim::Optimizer& opt) { return opt.state_bytes() + opt.master_bytes(); }

std::string offload_summary(int64_t bytes, int64_t state_bytes, int64_t master_bytes, int64_t host_only_bytes) {
  const double mib = 1.0 / (1 << 20);
  std::string s = absl::StrFormat(
      "loom train: --offload-optimizer: %.1f MiB of GPU memory per rank moved to pinned host memory "
      "(optimizer state %.1f MiB, f32 masters %.1f MiB)",
      bytes * mib, state_bytes * mib, master_bytes * mib);
  if (host_only_bytes > 0)
    s += absl::StrFormat("; the host also keeps %.1f MiB of f32 masters of f32 weights the GPU keeps", host_only_bytes * mib);
  return s;
}

void print_offload_summary(const optim::Optimizer& opt) {
  int64_t host_only = 0;  // f32 parameters: the GPU keeps the weight, the host its master copy
  for (const auto& p : opt.params())
    if (p.master.defined() && p.var.dtype() == DType::f32) host_only += p.master.nbytes();
  std::printf("%s\n", offload_summary(offloaded_gpu_bytes(opt), opt.state_bytes(), opt.master_bytes(), host_only).c_str());
  std::fflush(stdout);
}

}  // namespace loom
