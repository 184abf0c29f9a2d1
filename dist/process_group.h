// The process group of a distributed run: MPI initialisation (mpirun, a hostfile, Slurm's
// `srun --mpi=pmix`), rank and world size, the local rank among the ranks sharing this host
// (MPI_Comm_split_type shared memory) that picks the GPU, an MPI Communicator for CPU tensors and,
// for a CUDA run, an NCCL one bootstrapped from rank 0's ncclUniqueId.
#pragma once
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "dist/communicator.h"
#include "engine/device.h"

namespace loom::dist {

struct DistOptions {
  double timeout_s = kDefaultTimeoutSeconds;  // per-collective deadline (--dist-timeout)
  bool cuda = false;                          // pick cuda:<local rank> and build the NCCL communicator
};

class ProcessGroup {
 public:
  // Initialises MPI (once per process; a process not started by a launcher is a world of one) and
  // the communicators. A CUDA run with more local ranks than visible GPUs is an error naming both.
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> init(const DistOptions& options);
  ~ProcessGroup();  // tears down NCCL, then MPI_Finalize

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& host() const { return host_; }
  double timeout_s() const { return options_.timeout_s; }
  // This rank's compute device: cuda:<local rank> in a CUDA run, else cpu.
  Device device() const { return device_; }
  // MPI over CPU tensors (always present).
  Communicator& cpu() { return *cpu_; }
  // The communicator for tensors on `d`: NCCL for CUDA, MPI for CPU.
  Communicator& for_device(Device d);

 private:
  ProcessGroup() = default;
  DistOptions options_;
  int rank_ = 0, world_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string host_;
  Device device_ = Device::cpu();
  std::unique_ptr<Communicator> cpu_, nccl_;
};

}  // namespace loom::dist
