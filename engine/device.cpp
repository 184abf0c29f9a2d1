// Device parsing and CUDA availability queries.
#include "engine/device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#if LOOM_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace loom {

absl::StatusOr<Device> parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  int index = 0;
  if (text.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(text.substr(5), &index) && index >= 0)
    return Device::cuda(index);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", text, "': expected cpu, cuda or cuda:N"));
}

int cuda_device_count() {
#if LOOM_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

}  // namespace loom
