// NaN and infinity checks for tensors that cross the disk boundary: weights as they load (a clear
// error naming the tensor and the first bad element) and everything Loom writes (never a NaN on disk).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/tensor.h"

namespace loom {

// The flat (row-major) index of the first NaN or infinity in t, or -1 when there is none or t is
// not a float tensor. Any device: a CUDA tensor is summed on the device first and only copied to
// the host when the sum is not finite.
int64_t first_nonfinite(const Tensor& t);

// "nan at [3, 17] (element 1553 of 4096)": where t's first non-finite element is and what it is.
std::string describe_nonfinite(const Tensor& t, int64_t index);

// OkStatus when every element of t is finite; else InvalidArgument
// "<where>: tensor '<name>' holds nan at [i, j] (element k of n)<advice>".
absl::Status check_finite(const Tensor& t, const std::string& where, const std::string& name,
                          const std::string& advice = "");

// What every writer calls before it creates `path`: OkStatus when every tensor is finite, else
// FailedPrecondition "refusing to write <path>: tensor '<name>' holds nan at [...] ...: training
// diverged or the weights were damaged; nothing was written". GGUF export and the safetensors
// writers of models/ and train/ use it.
absl::Status check_finite_to_save(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& path);

}  // namespace loom
