// LOOM_CUDA_CHECK / LOOM_CUBLAS_CHECK for host-side engine code (.cpp files compiled by the C++
// compiler). Only include from code inside `#if LOOM_WITH_CUDA`.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "kernels/error.h"

#ifndef LOOM_CUDA_CHECK
#define LOOM_CUDA_CHECK(expr)                                                                  \
  do {                                                                                         \
    cudaError_t loom_err_ = (expr);                                                            \
    if (loom_err_ != cudaSuccess)                                                              \
      ::loom::detail::fail(__FILE__, __LINE__,                                                 \
                           ::loom::detail::cat("CUDA error ", cudaGetErrorString(loom_err_),   \
                                               " in ", #expr));                                \
  } while (0)
#endif

#define LOOM_CUBLAS_CHECK(expr)                                                                \
  do {                                                                                         \
    cublasStatus_t loom_st_ = (expr);                                                          \
    if (loom_st_ != CUBLAS_STATUS_SUCCESS)                                                     \
      ::loom::detail::fail(__FILE__, __LINE__,                                                 \
                           ::loom::detail::cat("cuBLAS status ", int(loom_st_), " in ", #expr)); \
  } while (0)
