// Internal to the engine, its tests and benchmarks: the grouped products of engine/ops.h with the
// CUDA variant named (kernels/grouped_gemm.h), so that cuBLAS's grouped call and the per-expert
// cuBLASLt loop can be compared on the same tensors. The public functions pass kAuto.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/ops.h"
#include "engine/tensor.h"
#include "kernels/grouped_gemm.h"

namespace loom::ops::detail {

void grouped_matmul_into(const Tensor& a, const Tensor& b, Tensor& c, const std::vector<int64_t>& offsets,
                         bool trans_b, float alpha, float beta, GroupedGemmVariant variant);
void grouped_matmul_dual_into(const Tensor& a, const Tensor& b, const Tensor& a2, const Tensor& b2, Tensor& c,
                              const std::vector<int64_t>& offsets, bool trans_b, float alpha, float beta,
                              GroupedGemmVariant variant);
void grouped_matmul_tn_into(const Tensor& a, const Tensor& b, Tensor& c, const std::vector<int64_t>& offsets,
                            float alpha, float beta, GroupedGemmVariant variant);

}  // namespace loom::ops::detail
