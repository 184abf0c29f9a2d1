// The adapter's operands as hi + lo bf16 parts (kernels/bf16_split.h), shared by lora_linear
// (fn_lora.cpp) and lora_linear_shared (fn_lora_shared.cpp).
#pragma once
#include <string>

#include "engine/ops.h"

namespace loom::ag::detail {

// [rows, cols] f32 -> bf16 [parts * rows, cols]: the parts stacked along the rows (a view of the
// flattened split).
inline Tensor split_rows(const Tensor& m, const std::string& pattern) {
  const int64_t rows = m.size(0), cols = m.size(1);
  return ops::bf16_split(m.to(DType::f32).reshape({1, rows * cols}), pattern)
      .view({static_cast<int64_t>(pattern.size()) * rows, cols});
}

}  // namespace loom::ag::detail
