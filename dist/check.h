// The check macros every MPI and NCCL call goes through: a failure throws loom::Error naming the
// library's error string, the expression, file and line. NCCL's macro exists only with LOOM_CUDA.
#pragma once
#include <mpi.h>

#include "kernels/error.h"

#define LOOM_MPI_CHECK(expr)                                                                        \
  do {                                                                                              \
    int loom_mpi_rc_ = (expr);                                                                      \
    if (loom_mpi_rc_ != MPI_SUCCESS) {                                                              \
      char loom_mpi_msg_[MPI_MAX_ERROR_STRING];                                                     \
      int loom_mpi_len_ = 0;                                                                        \
      MPI_Error_string(loom_mpi_rc_, loom_mpi_msg_, &loom_mpi_len_);                                \
      ::loom::detail::fail(__FILE__, __LINE__,                                                      \
                           ::loom::detail::cat("MPI error ", std::string(loom_mpi_msg_, loom_mpi_len_), \
                                               " in ", #expr));                                     \
    }                                                                                               \
  } while (0)

#if LOOM_WITH_CUDA
#include <nccl.h>
#define LOOM_NCCL_CHECK(expr)                                                                       \
  do {                                                                                              \
    ncclResult_t loom_nccl_rc_ = (expr);                                                            \
    if (loom_nccl_rc_ != ncclSuccess && loom_nccl_rc_ != ncclInProgress)                            \
      ::loom::detail::fail(__FILE__, __LINE__,                                                      \
                           ::loom::detail::cat("NCCL error ", ncclGetErrorString(loom_nccl_rc_),    \
                                               " (", static_cast<int>(loom_nccl_rc_), ") in ", #expr)); \
  } while (0)
#endif
