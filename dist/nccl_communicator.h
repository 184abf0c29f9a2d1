// The NCCL backend of Communicator, for CUDA tensors: bootstrapped over MPI (rank 0's
// ncclUniqueId reaches every rank by MPI_Bcast, then ncclCommInitRank), collectives on its own
// high-priority stream ordered after the compute stream with events, uneven reduce-scatters as
// grouped ncclReduce calls, and a watchdog thread that polls ncclCommGetAsyncError and each
// collective's deadline: on an error or a missed deadline it names this rank and the collective,
// aborts the NCCL communicator and ends the job (MPI_Abort) with a non-zero status.
#pragma once
#include <mpi.h>

#include <memory>

#include "dist/communicator.h"

namespace loom::dist {

// Collective over `comm` (every rank calls it). device: this rank's CUDA device. Throws
// loom::Error in a build without CUDA.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, int device, double timeout_s);

}  // namespace loom::dist
