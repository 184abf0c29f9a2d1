// Who this process is in a multi-process launch, read from what the launcher exports: Open MPI's
// mpirun (OMPI_COMM_WORLD_*), PMI/PMIx-based launchers including MPICH and Slurm's
// `srun --mpi=pmix` (PMI_RANK/PMI_SIZE, PMIX_RANK), plain Slurm (SLURM_PROCID/SLURM_NTASKS/
// SLURM_LOCALID) and torchrun-style variables (RANK/WORLD_SIZE/LOCAL_RANK).
#pragma once
#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace loom {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;      // index on this host: picks the CUDA device
  std::string launcher;    // "single", "openmpi", "pmi", "slurm", "torchrun"
};

// getenv by default; tests pass their own lookup. Inconsistent or malformed values are errors
// naming the variable.
absl::StatusOr<LaunchEnv> detect_launch_env(
    const std::function<const char*(const char*)>& getenv_fn = [](const char* k) { return std::getenv(k); });

}  // namespace loom
