// Internal to the engine, its tests and benchmarks: the grouped products of engine/ops.h with the
// CUDA variant named (kernels/grouped_gemm.h), so that cuBLAS's grouped call and the per-expert
// cuBLASLt loop can be compared on the same tensors. The public functions pass kAuto.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/ops.h"
#include "engine/tensor.h"
#include "kernels/grouped_gemm.h"
#include "kernels/nf4.h"

namespace loom::ops::detail {

void grouped_matmul_into(const Tensor& a, const Tensor& b, Tensor& c, const std::vector<int64_t>& offsets,
                         bool trans_b, float alpha, float beta, GroupedGemmVariant variant);
void grouped_matmul_dual_into(const Tensor& a, const Tensor& b, const Tensor& a2, const Tensor& b2, Tensor& c,
                              const std::vector<int64_t>& offsets, bool trans_b, float alpha, float beta,
                              GroupedGemmVariant variant);
void grouped_matmul_tn_into(const Tensor& a, const Tensor& b, Tensor& c, const std::vector<int64_t>& offsets,
                            float alpha, float beta, GroupedGemmVariant variant);
// ops::grouped_matmul_nf4_into with the kernel named: kAuto, the cp.async Hopper kernel where the rule
// gives it the bf16 products; kSm90Tma, the TMA-fed kernel's NF4 path (kernels/grouped_gemm_tma.h).
bool grouped_matmul_nf4_into(const Tensor& a, const std::vector<Nf4Parts>& w, int64_t out, int64_t in, const Tensor& a2,
                             const Tensor& b2, Tensor& c, const std::vector<int64_t>& offsets, bool trans_b,
                             GroupedGemmVariant variant);

// The kernels' view of q for n elements beside `out` (its device), after checking q's tensors
// (engine/ops_quant.cpp; op names the caller).
Nf4State checked_state(const char* op, const Nf4Parts& q, int64_t n, const Tensor& out);

}  // namespace loom::ops::detail
