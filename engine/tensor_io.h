// Tensors to and from safetensors files: the Tensor-level layer over engine/safetensors.h.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/safetensors.h"
#include "engine/tensor.h"

namespace loom {

// Writes named tensors (any device; converted to `dtype` when given, else kept) atomically.
absl::Status save_tensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                          std::optional<DType> dtype = std::nullopt,
                          const std::map<std::string, std::string>& metadata = {});
// One tensor of an open file as an owned CPU tensor (the mapping is read-only).
Tensor read_tensor(const SafetensorsFile& file, const TensorInfo& info);
// Every tensor of a file, owned, on the CPU.
absl::StatusOr<std::map<std::string, Tensor>> load_tensors(const std::string& path);

}  // namespace loom
