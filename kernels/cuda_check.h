// The check macros every CUDA runtime and cuBLAS(Lt) call goes through, for .cu and host .cpp
// files alike: a failure throws loom::Error naming the status, the expression, file and line.
// Include only where CUDA is compiled in (LOOM_WITH_CUDA).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "kernels/error.h"

#define LOOM_CUDA_CHECK(expr)                                                                  \
  do {                                                                                         \
    cudaError_t loom_err_ = (expr);                                                            \
    if (loom_err_ != cudaSuccess)                                                              \
      ::loom::detail::fail(__FILE__, __LINE__,                                                 \
                           ::loom::detail::cat("CUDA error ", cudaGetErrorString(loom_err_),   \
                                               " in ", #expr));                                \
  } while (0)

#define LOOM_CUBLAS_CHECK(expr)                                                                     \
  do {                                                                                              \
    cublasStatus_t loom_st_ = (expr);                                                               \
    if (loom_st_ != CUBLAS_STATUS_SUCCESS)                                                          \
      ::loom::detail::fail(__FILE__, __LINE__,                                                      \
                           ::loom::detail::cat("cuBLAS error ", cublasLtGetStatusString(loom_st_), \
                                               " (", static_cast<int>(loom_st_), ") in ", #expr));  \
  } while (0)
