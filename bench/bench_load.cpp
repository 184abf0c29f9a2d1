// loom_load_bench MODEL_DIR [--dtype bf16|f32] [--device cuda|cpu]: times CausalLM::load of a
// Hugging Face folder and, in the same process, a plain sequential read() of its safetensors files
// (the disk or page-cache ceiling). Page caches are dropped before each when the system allows it
// (root on Linux), so both are cold reads; otherwise both run warm and the output says so.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/cuda_context.h"
#include "models/causal_lm.h"

namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

bool drop_caches() {
  sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "3\n";
  f.flush();
  return static_cast<bool>(f);
}

std::vector<fs::path> weight_files(const std::string& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") out.push_back(e.path());
  return out;
}

double read_all(const std::vector<fs::path>& files, size_t* bytes) {
  std::vector<char> buf(64u << 20);
  *bytes = 0;
  const auto t0 = Clock::now();
  for (const auto& p : files) {
    const int fd = open(p.c_str(), O_RDONLY);
    if (fd < 0) continue;
    ssize_t n;
    while ((n = read(fd, buf.data(), buf.size())) > 0) *bytes += static_cast<size_t>(n);
    close(fd);
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: loom_load_bench MODEL_DIR [--dtype bf16|f32] [--device cuda|cpu]\n");
    return 2;
  }
  const std::string dir = argv[1];
  loom::LoadOptions opt{loom::DType::bf16, loom::cuda_available() ? loom::Device::cuda(0) : loom::Device::cpu()};
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dtype") opt.dtype = v == "f32" ? loom::DType::f32 : loom::DType::bf16;
    if (k == "--device") opt.device = v == "cpu" ? loom::Device::cpu() : loom::Device::cuda(0);
  }
  if (opt.device.is_cuda()) loom::CudaContext::get(0);  // context creation is not load time
  const auto files = weight_files(dir);
  const bool cold = drop_caches();
  auto t0 = Clock::now();
  auto model = loom::CausalLM::load(dir, opt);
  if (opt.device.is_cuda()) loom::synchronize(0);
  const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!model.ok()) {
    std::fprintf(stderr, "load failed: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  int64_t params = 0;
  for (const auto& [name, v] : (*model)->named_weights()) params += v->value().numel();
  model->reset();
  if (cold) drop_caches();
  size_t bytes = 0;
  const double read_s = read_all(files, &bytes);
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("checkpoint: %s, %zu files, %.2f GB, %.2f B parameters, caches %s\n", dir.c_str(), files.size(), gb,
              static_cast<double>(params) / 1e9, cold ? "dropped before each (cold)" : "NOT dropped (warm)");
  std::printf("raw read():        %6.2f s  %6.2f GB/s\n", read_s, gb / read_s);
  std::printf("CausalLM::load:    %6.2f s  %6.2f GB/s  (%s, %s)  = %.0f%% of raw read\n", load_s, gb / load_s,
              opt.device.str().c_str(), std::string(loom::name(opt.dtype)).c_str(), 100.0 * read_s / load_s);
  return 0;
}
