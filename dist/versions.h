// What `loom doctor` reports of the collective libraries: the MPI library's own version string
// (readable before MPI starts), NCCL's version and whether a communicator of one rank starts on a
// GPU (CUDA builds; "" / Unimplemented otherwise).
#pragma once
#include <string>

#include "absl/status/status.h"

namespace loom {

std::string mpi_library_version();  // MPI_Get_library_version's first line
std::string nccl_version();         // "2.27.3"; "" in a CPU-only build
// A world-of-one NCCL communicator on GPU `device`, started and destroyed.
absl::Status nccl_world_of_one(int device);

}  // namespace loom
