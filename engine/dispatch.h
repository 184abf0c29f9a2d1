// Internal to engine/ops_*.cpp: dtype dispatch, device checks and per-device stream lookup.
#pragma once
#include <type_traits>

#include "engine/cuda_context.h"
#include "engine/tensor.h"
#include "kernels/error.h"
#include "kernels/gemm.h"

namespace loom::ops::detail {

// Calls fn(T{}) with T = float, double or bf16 according to dtype.
template <class Fn>
void dispatch_float(const char* op, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32: fn(float{}); return;
    case DType::f64: fn(double{}); return;
    case DType::bf16: fn(bf16{}); return;
    default: LOOM_CHECK(false, op, ": unsupported dtype ", name(dtype), " (expected f32, f64 or bf16)");
  }
}

inline Stream stream_of(const Tensor& t) { return CudaContext::get(t.device().index).stream; }

inline void same_device(const char* op, const Tensor& a, const Tensor& b) {
  LOOM_CHECK(a.device() == b.device(), op, ": tensors on different devices: ", a.str(), " and ", b.str());
}
inline void same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  LOOM_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ: ", a.str(), " and ", b.str());
}
inline void same_shape(const char* op, const Tensor& a, const Tensor& b) {
  LOOM_CHECK(a.shape() == b.shape(), op, ": shapes differ: ", a.str(), " and ", b.str());
}
inline void expect_dtype(const char* op, const Tensor& t, DType d, const char* what) {
  LOOM_CHECK(t.dtype() == d, op, ": ", what, " must be ", name(d), ", got ", t.str());
}
inline void expect_contiguous(const char* op, const Tensor& t, const char* what) {
  LOOM_CHECK(t.is_contiguous(), op, ": ", what, " must be contiguous, got a strided ", t.str());
}

// The GEMM type of a float dtype (kernels/gemm.h).
inline GemmType gemm_type(const char* op, DType d) {
  switch (d) {
    case DType::f32: return GemmType::kF32;
    case DType::bf16: return GemmType::kBF16;
    case DType::f64: return GemmType::kF64;
    default: LOOM_CHECK(false, op, ": unsupported dtype ", name(d));
  }
  return GemmType::kF32;
}

// A GEMM operand and its leading dimension: a matrix whose rows are contiguous, with any row
// stride (a column slice of a wider one), goes in as it is; anything else is made contiguous
// (leading dimension: its last size).
inline Tensor gemm_operand(const Tensor& t, int64_t& ld) {
  if (t.dim() == 2 && t.strides()[1] == 1 && t.strides()[0] >= t.size(1) && t.size(0) > 1) {
    ld = t.strides()[0];
    return t;
  }
  Tensor c = t.contiguous();
  ld = c.size(-1);
  return c;
}

}  // namespace loom::ops::detail

// Inside a dispatch lambda with type T: runs `stmt` on CUDA, rejecting f64 there, or reports
// that this build has no CUDA.
#if LOOM_WITH_CUDA
#define LOOM_ON_CUDA(op, T, ...)                                                       \
  do {                                                                                 \
    if constexpr (std::is_same_v<T, double>) {                                         \
      LOOM_CHECK(false, op, ": f64 is CPU-only (used for gradient checks)");           \
    } else {                                                                           \
      __VA_ARGS__;                                                                     \
    }                                                                                  \
  } while (0)
#else
#define LOOM_ON_CUDA(op, T, ...) LOOM_CHECK(false, op, ": Loom was built without CUDA (LOOM_CUDA=OFF)")
#endif
