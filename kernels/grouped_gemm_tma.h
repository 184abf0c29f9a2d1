// The Hopper grouped GEMM fed by TMA (kernels/cuda/grouped_gemm_sm90_tma.cu): a mixture-of-experts
// layer's row-grouped products (forward y = x W_e^T, input gradient dx = dy W_e, each optionally with a
// LoRA term summed into the same accumulators) in one persistent launch, every operand read through a
// tensor map of the whole stacked tensor instead of per-problem pointers. A producer warp streams
// 128 x 64 tiles of the activations and 256 x 64 tiles of the experts' weights into a 4-stage ring; two
// consumer warpgroups only multiply (128 x 256 output tiles) and store. With clusters of two, the pair of
// CTAs takes two adjacent 128-row tiles of one expert and one 256-column tile and each loads half of the
// shared weight tile for both (TMA multicast): 32 KiB of operands from L2 a k-step instead of 48.
// Measured against the cp.async kernel (kSm90Wide) end to end (session 40): the experts' row-grouped
// products run here (kExpertsOnTmaKernel, kernels/grouped_gemm.h).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/grouped_gemm.h"

namespace loom {

// Experts the kernel takes (its per-expert offsets travel as launch arguments).
inline constexpr int64_t kSm90TmaMaxExperts = 256;

// Why the TMA kernel cannot run g (and second, its LoRA term, or null) over these offsets, or nullptr.
// It needs: bf16 A and B, a bf16 or f32 C written contiguously ([N, m]); every row stride and K a
// multiple of 8 elements and A, B 16-byte aligned (tensor maps); m even; second with g's transposes,
// m, C, types, alpha and beta; at most kSm90TmaMaxExperts experts and fewer than 2^31 rows.
const char* sm90_tma_unsupported(const RowGroupedGemm& g, const RowGroupedGemm* second,
                                 const std::vector<int64_t>& offsets);

}  // namespace loom

namespace loom::cuda {

// Runs g (+ second) over the experts' rows: C[rows_e] = alpha (A[rows_e] op(B[e]) + A2[rows_e] op(B2[e])) +
// beta C[rows_e] (experts without rows untouched). cluster: 1 or 2 CTAs a cluster; sm_count <= 0: the
// device's. Throws when sm90_tma_unsupported or the GPU cannot run it (sm90_grouped_gemm_ready).
void sm90_grouped_gemm_tma(const RowGroupedGemm& g, const RowGroupedGemm* second, const std::vector<int64_t>& offsets,
                           int cluster, int sm_count, Stream s);

}  // namespace loom::cuda
