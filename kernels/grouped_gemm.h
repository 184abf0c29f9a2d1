// Grouped GEMMs of mixture-of-experts layers: one row-major GEMM (kernels/gemm.h) per expert over
// that expert's rows, described as a list of GemmArgs problems. The CPU runs them one by one; CUDA
// runs them as one cublasGemmGroupedBatchedEx call, as one cuBLASLt call each (choose_grouped_gemm),
// or, asked for by name on Hopper, as one launch of Loom's own wgmma kernel (kSm90).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/gemm.h"

// cublas_api.h declares `typedef struct cublasContext* cublasHandle_t;` at global scope; the same
// declaration here lets callers hold a handle without including CUDA headers.
struct cublasContext;
typedef cublasContext* cublasHandle_t;

namespace loom {

// Rows [offsets[e], offsets[e + 1]) of an activation matrix belong to expert e: E + 1 offsets,
// offsets[0] = 0, non-decreasing, offsets[E] = rows. Throws loom::Error naming `op` otherwise.
void check_group_offsets(const char* op, const std::vector<int64_t>& offsets, int64_t rows);

// Row-grouped (a layer's forward, and its input gradient): for each expert e with rows,
//   C[rows_e] (n_e x m) = alpha * A[rows_e] (n_e x k) op(B[e]) + beta * C[rows_e]
// A [N, k] with row stride lda; B [E, k, m] (or [E, m, k] when trans_b), contiguous; C [N, m]
// contiguous. Experts without rows have no problem.
struct RowGroupedGemm {
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t k = 0, m = 0;
  bool trans_b = false;
  GemmType ab_type = GemmType::kF32, c_type = GemmType::kF32;
  float alpha = 1.f, beta = 0.f;
};
std::vector<GemmArgs> row_grouped_problems(const RowGroupedGemm& g, const std::vector<int64_t>& offsets);

// Reduction-grouped (weight gradients): for each expert e with rows,
//   C[e] (m x k) = alpha * A[rows_e]^T (m x n_e) B[rows_e] (n_e x k) + beta * C[e]
// A [N, m] with row stride lda; B [N, k] with ldb; C [E, m, k] contiguous. Experts without rows have
// no problem: their C[e] is the caller's to scale by beta (0 when beta is 0).
struct ReductionGroupedGemm {
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t m = 0, k = 0;
  GemmType ab_type = GemmType::kF32, c_type = GemmType::kF32;
  float alpha = 1.f, beta = 0.f;
};
std::vector<GemmArgs> reduction_grouped_problems(const ReductionGroupedGemm& g, const std::vector<int64_t>& offsets);

// The second products of a dual list (sm90_dual_unsupported) as separate products that accumulate
// onto the first's result: second's with problems[i]'s alpha and beta 1 (how a backend without the
// fused kernel runs a dual list, after `problems`).
std::vector<GemmArgs> second_accumulating(const std::vector<GemmArgs>& problems, const std::vector<GemmArgs>& second);

// How CUDA runs a list of problems: kCublasGrouped, one cublasGemmGroupedBatchedEx call (all
// problems in one launch, its SMs shared out between them); kLoop, one cuBLASLt call each
// (cuda::gemm: per-shape heuristic algorithms, but a product of a few hundred rows fills a fraction
// of the GPU and they run one after another); kSm90, Loom's persistent Hopper kernel
// (kernels/cuda/grouped_gemm_sm90.cu: every problem's 128 x 128 tiles in one launch of wgmma, bf16
// operands only, see sm90_grouped_unsupported); kSm90Wide, the same kernel with 128 x 256 tiles (half
// the operand traffic per product, twice the accumulators); kAuto, what choose_grouped_gemm says.
// kSm90Tma: the TMA-fed kernel in clusters of two (kernels/grouped_gemm_tma.h), which ops:: runs for
// row-grouped products (forward, input gradient), by name or for kAuto (kExpertsOnTmaKernel, below); a
// list given to grouped_gemm with it (a weight gradient's) runs what kAuto picks.
enum class GroupedGemmVariant { kAuto, kCublasGrouped, kLoop, kSm90, kSm90Wide, kSm90Tma };
const char* grouped_gemm_variant_name(GroupedGemmVariant v);

// Why cublasGemmGroupedBatchedEx cannot run these problems (a type pair it lacks: it has f32->f32
// and bf16->bf16 but no bf16->f32; a pointer not 16-byte aligned; a batched problem), or nullptr.
const char* cublas_grouped_unsupported(const std::vector<GemmArgs>& problems);

// Why the kSm90 kernel cannot run these problems, or nullptr. It needs: one type pair, bf16 -> bf16
// or bf16 -> f32; single (not batched) products sharing trans_a, trans_b, alpha and beta; A and B
// 16-byte aligned with lda, ldb multiples of 8, and their contiguous dimension (K of a K-major
// operand, M of a transposed A, N of an untransposed B) a multiple of 8 elements; C aligned to two
// elements, ldc and n even; sizes and leading dimensions under 2^30. Whether the GPU is a Hopper is
// cuda::sm90_grouped_gemm_ready's question.
const char* sm90_grouped_unsupported(const std::vector<GemmArgs>& problems);

// Two products summed into one output (a LoRA adapter's low-rank term folded into its base
// product): for each i, C_i = alpha (op(A_i) op(B_i) + op(A2_i) op(B2_i)) + beta C_i, where second[i]
// gives A2_i, B2_i, their depth k and leading dimensions, and shares problems[i]'s m, n, C, transposes
// and types. Why the kSm90 kernel cannot run them as one (sm90_grouped_unsupported of either list,
// or lists that do not pair up), or nullptr.
const char* sm90_dual_unsupported(const std::vector<GemmArgs>& problems, const std::vector<GemmArgs>& second);

// The one selection rule (kSm90Wide, kSm90, kCublasGrouped or kLoop) for problems on a GPU of `sm_count` SMs; see
// its definition for the measurements behind it.
GroupedGemmVariant choose_grouped_gemm(const std::vector<GemmArgs>& problems, int sm_count);

// Two choices the list rule leaves open, answered by measurement on the H200 (bench/results/session40,
// Qwen3-30B-A3B's shape at 24 layers, batch 4 x 2048, LoRA on attention and every expert):
// - the experts' row-grouped bf16 products (forward, input gradient) go to the TMA-fed kernel
//   (kSm90Tma, kernels/grouped_gemm_tma.h) wherever it can run what the rule gives the Hopper kernel:
//   LoRA recompute 28,016 tokens/s against 27,292 with the rule's pick (one call);
// - QLoRA experts are dequantised a chunk at a time (models/layers.cpp) before those products, not
//   multiplied by their NF4 codes inside the GEMM: QLoRA recompute 24,304 tokens/s that way against
//   20,841 with the cp.async kernel's NF4 path and 20,402 with the TMA kernel's (one call). Those
//   paths lost twice (session 37's first version: 20,262) and were taken out in session 40; the
//   git history has them (kernels/cuda/grouped_gemm_nf4.cuh, sm90_grouped_gemm_nf4, _tma_nf4).
inline constexpr bool kExpertsOnTmaKernel = true;

}  // namespace loom

namespace loom::cpu {
// cpu::gemm for each problem in turn.
void grouped_gemm(const std::vector<GemmArgs>& problems);
// A dual list (sm90_dual_unsupported's): `problems`, then second_accumulating(problems, second).
void grouped_gemm_dual(const std::vector<GemmArgs>& problems, const std::vector<GemmArgs>& second);
}  // namespace loom::cpu

namespace loom::cuda {
// What a grouped launch needs: the cuBLAS handle (its workspace is set to `ws` here when its stream
// is not yet s), the cuBLASLt handle and workspace of cuda::gemm, and the GPU's SM count for kAuto.
struct GroupedGemmContext {
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  GemmWorkspace ws;
  int sm_count = 0;
};
// Device entries a grouped launch needs in `pointers`: kCublasGrouped's A, B and C pointer arrays
// (3 per problem), or kSm90's problem descriptors (80 bytes): 10 slots per problem.
inline constexpr size_t kSm90SlotsPerProblem = 10;
inline size_t grouped_gemm_pointer_slots(size_t problems) { return kSm90SlotsPerProblem * problems; }
// Runs the problems (none may be batched; all share one type pair) on stream s. kCublasGrouped
// writes its pointer arrays into `pointers` (device memory of grouped_gemm_pointer_slots entries,
// 8-byte aligned, unused by kLoop) with a small kernel whose launch arguments carry them, so no host
// buffer has to outlive the call; a forced kCublasGrouped on problems it cannot run throws.
void grouped_gemm(const std::vector<GemmArgs>& problems, GroupedGemmVariant variant, const GroupedGemmContext& c,
                  void** pointers, Stream s);
// A dual list (sm90_dual_unsupported's): one launch of the Hopper kernel when the variant (kAuto: the
// rule's pick for `problems`) is kSm90 or kSm90Wide and the kernel can fuse them, else grouped_gemm of
// `problems` with the variant, then of second_accumulating(problems, second) with it too (the rule's
// pick for kAuto or a Hopper variant).
void grouped_gemm_dual(const std::vector<GemmArgs>& problems, const std::vector<GemmArgs>& second,
                       GroupedGemmVariant variant, const GroupedGemmContext& c, void** pointers, Stream s);

// The Hopper kernel (kSm90, kSm90Wide): whether this build has it (sm_90a) and the current GPU runs it
// (compute 9.0).
bool sm90_grouped_gemm_ready();
// Runs the problems through it (what grouped_gemm does for kSm90): their descriptors go to
// `pointers` (grouped_gemm_pointer_slots entries, 8-byte aligned) through small kernels whose
// launch arguments carry them, then one persistent launch of min(tiles, sm_count) blocks
// (sm_count <= 0: the device's). Throws when sm90_grouped_unsupported or the GPU says no.
// With `second`, a dual list summed into the same accumulators (sm90_dual_unsupported). tile_n: the
// output tiles' width, 128 (kSm90) or 256 (kSm90Wide).
void sm90_grouped_gemm(const std::vector<GemmArgs>& problems, int sm_count, void** pointers, Stream s,
                       const std::vector<GemmArgs>* second = nullptr, int tile_n = 128);
}  // namespace loom::cuda
