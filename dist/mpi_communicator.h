// The MPI backend of Communicator, for CPU tensors: non-blocking MPI-3 collectives
// (MPI_Iallreduce, MPI_Ireduce_scatter, ...) completed by wait(), which polls them against the
// per-collective deadline. MPI offers no way to cancel a blocked collective, so a collective that
// outlives the deadline makes this rank print which rank it is and what it waited for, and call
// MPI_Abort: the launcher then ends every rank with a non-zero status.
#pragma once
#include <mpi.h>

#include <functional>
#include <memory>

#include "dist/communicator.h"

namespace loom::dist {

class MpiCommunicator : public Communicator {
 public:
  // Duplicates `comm` (errors returned, not fatal). timeout_s: the deadline of each collective.
  MpiCommunicator(MPI_Comm comm, double timeout_s);
  ~MpiCommunicator() override;

  std::string backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  void all_reduce(Tensor& t, ReduceOp op) override;
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const std::vector<int64_t>& counts = {}) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int root) override;
  void barrier() override;
  void wait() override;
  int64_t issued() const override { return issued_; }
  void wait_until(int64_t ticket) override;

  MPI_Comm comm() const { return comm_; }

 private:
  struct Pending {
    MPI_Request request = MPI_REQUEST_NULL;
    int64_t ticket = 0;
    std::string what;
    std::vector<Tensor> keep;    // alive until complete
    std::function<void()> done;  // runs after completion (averaging)
  };
  void issue(Pending p);
  void wait_one(Pending& p);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, world_ = 1;
  double timeout_s_;
  int64_t issued_ = 0;
  std::vector<Pending> pending_;
  MPI_Datatype bf16_type_ = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
};

}  // namespace loom::dist
