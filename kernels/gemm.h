// Matrix products: one batched, strided, row-major GEMM description shared by the CPU reference
// (Eigen) and the CUDA path (one cuBLASLt wrapper with cached descriptors and heuristic algos).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/common.h"

// cublasLt.h declares `typedef struct cublasLtContext* cublasLtHandle_t;` at global scope; the
// same declaration here lets callers hold a handle without including CUDA headers.
struct cublasLtContext;
typedef cublasLtContext* cublasLtHandle_t;

namespace loom {

enum class GemmType { kF32, kBF16, kF64 /* CPU only */ };

// Bytes per element of a GemmType.
inline size_t gemm_type_size(GemmType t) {
  return t == GemmType::kBF16 ? 2 : t == GemmType::kF32 ? 4 : 8;
}
const char* gemm_type_name(GemmType t);

// All matrices are ROW-MAJOR: element (r, c) of a matrix with leading dimension ld is at r*ld + c.
//   for b in [0, batch):  C[b] (m x n) = alpha * op(A[b]) * op(B[b]) + beta * C[b]
// op(X) = X^T when trans_x. A is stored [m, k] (or [k, m] when trans_a) with leading dimension lda;
// B is stored [k, n] (or [n, k] when trans_b) with ldb; C is [m, n] with ldc. Item b of X starts
// at x + b * stride_x elements (stride 0 broadcasts A or B over the batch; C must not be shared).
// Supported types (ab_type -> c_type): f32 -> f32, bf16 -> bf16, bf16 -> f32, and f64 -> f64 on
// the CPU only. Products accumulate in f32 (f64 for f64) and each output is rounded once.
// beta == 0 never reads C (it may hold garbage, NaN included); otherwise C is read first, from c_in
// where given (same ldc, stride_c and type as c; c_in == c is the in-place default): D = alpha op(A)
// op(B) + beta C_in with D written to c, C_in left alone (cuBLASLt's C and D).
struct GemmArgs {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool trans_a = false, trans_b = false;
  const void* a = nullptr; int64_t lda = 0, stride_a = 0;  // strides between batch items, in elements
  const void* b = nullptr; int64_t ldb = 0, stride_b = 0;
  void* c = nullptr; int64_t ldc = 0, stride_c = 0;
  const void* c_in = nullptr;                 // where beta * C is read from (null: c itself)
  GemmType ab_type = GemmType::kF32;  // A and B share a type
  GemmType c_type = GemmType::kF32;   // C may be f32 with bf16 inputs (f32 accumulation always)
  float alpha = 1.f, beta = 0.f;      // beta != 0 accumulates into C (C is read first)
};

// Throws loom::Error naming the argument when `g` is malformed (sizes, leading dimensions, null
// pointers, unsupported type pair); `backend` ("cpu" or "cuda") appears in the message.
void check_gemm_args(const GemmArgs& g, const char* backend);

// Scratch for cuBLASLt's split-K / stream-K algorithms. 32 MiB is NVIDIA's recommendation on
// Hopper; 0 bytes is allowed (fewer algorithms). ptr must be 256-byte aligned (cudaMalloc is).
struct GemmWorkspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};
inline constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

}  // namespace loom

namespace loom::cpu {
// Eigen, multi-threaded through OpenMP; bf16 operands are widened to f32 buffers first.
void gemm(const GemmArgs& g);
}  // namespace loom::cpu

namespace loom::cuda {
// How a shape's cuBLASLt algorithm is chosen the first time it is seen:
//   kHeuristic  the heuristic's first answer;
//   kTimed      the heuristic's first kGemmTimedCandidates answers timed on that first call (its own A
//               and B, in place on a stream-ordered scratch copy of C as the call itself runs (C_in read
//               apart where GemmArgs::c_in is), freed
//               before returning; one host wait; the candidates take turns over three rounds, each timed
//               by its fastest round), the fastest kept where it beats the first by more than 2 % (close
//               calls keep the heuristic's pick, so a run does not flip between algorithms on timing
//               noise). The call itself then runs the chosen algorithm; later calls of the shape reuse it
//               (a shape accumulating onto C, beta != 0, is timed apart from the same shape with beta 0).
//               Falls back to the first answer when the scratch cannot be allocated or a candidate fails.
enum class GemmAlgoChoice { kHeuristic, kTimed };
inline constexpr int kGemmTimedCandidates = 8;
// cuBLASLt with CUBLAS_COMPUTE_32F (no TF32) and f32 scale; enqueued on stream s. Descriptors and
// the chosen algorithm are cached per (shape, layout, types, alignment, workspace, device, choice).
void gemm(const GemmArgs& g, cublasLtHandle_t handle, GemmWorkspace ws, Stream s,
          GemmAlgoChoice choice = GemmAlgoChoice::kHeuristic);
}  // namespace loom::cuda
