// Device: where a tensor's bytes live — the CPU or one CUDA device by index.
#pragma once
#include <string>

#include "absl/status/statusor.h"

namespace loom {

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static constexpr Device cpu() { return {DeviceType::kCpu, 0}; }
  static constexpr Device cuda(int i = 0) { return {DeviceType::kCuda, i}; }
  constexpr bool is_cpu() const { return type == DeviceType::kCpu; }
  constexpr bool is_cuda() const { return type == DeviceType::kCuda; }
  friend constexpr bool operator==(const Device&, const Device&) = default;
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

// "cpu", "cuda", "cuda:1"; anything else is an InvalidArgument naming the text.
absl::StatusOr<Device> parse_device(const std::string& text);

// True when Loom was compiled with CUDA and at least one device is visible.
bool cuda_available();
int cuda_device_count();

}  // namespace loom
