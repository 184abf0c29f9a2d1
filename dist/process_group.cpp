// MPI bootstrap and the communicators of a run (see process_group.h).
#include "dist/process_group.h"

#include <mpi.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "dist/check.h"
#include "dist/mpi_communicator.h"
#include "dist/nccl_communicator.h"
#include "engine/cuda_context.h"

namespace loom::dist {

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::init(const DistOptions& options) {
  if (!(options.timeout_s > 0))
    return absl::InvalidArgumentError(absl::StrCat("--dist-timeout must be a positive number of seconds, got ",
                                                   options.timeout_s));
  int initialized = 0;
  LOOM_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    // The NCCL watchdog thread may call MPI_Abort; ask for full thread support (it falls back to
    // _exit when the library offers less).
    int provided = 0;
    LOOM_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
  }
  std::unique_ptr<ProcessGroup> g(new ProcessGroup());
  g->options_ = options;
  LOOM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g->rank_));
  LOOM_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g->world_));
  MPI_Comm local;
  LOOM_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g->rank_, MPI_INFO_NULL, &local));
  LOOM_MPI_CHECK(MPI_Comm_rank(local, &g->local_rank_));
  LOOM_MPI_CHECK(MPI_Comm_size(local, &g->local_size_));
  LOOM_MPI_CHECK(MPI_Comm_free(&local));
  char host[256] = "?";
  gethostname(host, sizeof host);
  g->host_ = host;
  g->cpu_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, options.timeout_s);
  if (options.cuda) {
    const int gpus = cuda_device_count();
    // Every rank decides the same way, so a refusal happens on all of them before NCCL starts.
    int enough = g->local_rank_ < gpus ? 1 : 0, all = 0;
    LOOM_MPI_CHECK(MPI_Allreduce(&enough, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (!all)
      return absl::FailedPreconditionError(absl::StrCat(
          "a host runs more ranks than it has GPUs (this host ", g->host_, ": ", g->local_size_, " ranks, ", gpus,
          " visible GPUs): start at most one rank per GPU"));
    g->device_ = Device::cuda(g->local_rank_);
    g->nccl_ = make_nccl_communicator(MPI_COMM_WORLD, g->local_rank_, options.timeout_s);
  }
  return g;
}

ProcessGroup::~ProcessGroup() {
  nccl_.reset();
  cpu_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

Communicator& ProcessGroup::for_device(Device d) {
  if (d.is_cuda()) {
    LOOM_CHECK(nccl_ != nullptr, "ProcessGroup: a CUDA tensor but this run has no NCCL communicator (CPU run)");
    return *nccl_;
  }
  return *cpu_;
}

}  // namespace loom::dist
