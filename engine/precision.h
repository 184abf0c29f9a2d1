// One precision policy for a model and its training: which dtype each kind of tensor lives and
// computes in. The model, LoRA, the optimizer and the trainer read it instead of each deciding.
#pragma once
#include <string>

#include "absl/status/statusor.h"
#include "engine/device.h"
#include "engine/dtype.h"

namespace loom {

struct Precision {
  DType storage = DType::bf16;     // frozen weights and activations
  DType compute = DType::bf16;     // GEMM operands (always the storage dtype today)
  DType accumulate = DType::f32;   // GEMM accumulation, reductions, norm statistics, softmax/lse, the loss
  DType master = DType::f32;       // trainable weights' master copies and optimizer state
  DType adapter = DType::f32;      // LoRA A and B (PEFT keeps them in f32 next to a bf16 model)
  DType logits = DType::f32;       // what forward() returns

  // bf16 storage and compute with f32 everywhere precision matters (what `--dtype bf16` means).
  static constexpr Precision mixed_bf16() { return {}; }
  // Everything in f32 (`--dtype f32`; the reference path the fixture tests compare in).
  static constexpr Precision full_f32() {
    return {DType::f32, DType::f32, DType::f32, DType::f32, DType::f32, DType::f32};
  }
  // The policy for a model dtype: bf16 -> mixed_bf16, f32 -> full_f32, f64 (CPU gradient checks)
  // -> f64 throughout.
  static constexpr Precision for_dtype(DType storage) {
    if (storage == DType::bf16) return mixed_bf16();
    return {storage, storage, storage, storage, storage, storage};
  }
  std::string str() const;  // "storage bf16, compute bf16, accumulate f32, master f32, adapter f32"
};

// The model dtype when none is asked for, one rule for every command and the trainer: f32 on the
// CPU (its bf16 path is no faster and greedy answers of small models drift in bf16), bf16 on CUDA
// (tensor cores, half the memory).
constexpr DType default_model_dtype(Device device) { return device.is_cuda() ? DType::bf16 : DType::f32; }

// "bf16" or "f32" (the --dtype flag) -> the model's storage dtype; anything else names the flag.
absl::StatusOr<DType> parse_model_dtype(const std::string& text);

}  // namespace loom
