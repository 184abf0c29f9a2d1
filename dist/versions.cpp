// See versions.h.
#include "dist/versions.h"

#include <mpi.h>

#include "absl/strings/str_cat.h"
#include "kernels/common.h"
#if LOOM_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace loom {

std::string mpi_library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(buf, &len) != MPI_SUCCESS) return "";
  std::string v(buf, static_cast<size_t>(len));
  const size_t nl = v.find_first_of("\n,");
  return nl == std::string::npos ? v : v.substr(0, nl);
}

std::string nccl_version() {
#if LOOM_WITH_CUDA
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  return absl::StrCat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
#else
  return "";
#endif
}

absl::Status nccl_world_of_one(int device) {
#if LOOM_WITH_CUDA
  if (cudaSetDevice(device) != cudaSuccess) return absl::UnavailableError(absl::StrCat("cannot select GPU ", device));
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r == ncclSuccess) r = ncclCommInitRank(&comm, 1, id, 0);
  if (r != ncclSuccess) return absl::UnavailableError(absl::StrCat("NCCL: ", ncclGetErrorString(r)));
  ncclCommDestroy(comm);
  return absl::OkStatus();
#else
  (void)device;
  return absl::UnimplementedError("this build has no CUDA, so no NCCL (LOOM_CUDA=OFF)");
#endif
}

}  // namespace loom
