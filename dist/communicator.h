// Communicator: the collectives data parallelism needs (all-reduce, reduce-scatter, all-gather,
// broadcast, barrier) behind one interface, with an MPI backend for CPU tensors and an NCCL backend
// for CUDA tensors. Collectives are issued in the same order on every rank; each may run
// asynchronously and is complete for the caller's stream or host after wait().
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace loom::dist {

enum class ReduceOp { kSum, kAvg };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string backend() const = 0;  // "mpi" or "nccl"
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // In place over a contiguous tensor.
  virtual void all_reduce(Tensor& t, ReduceOp op) = 0;
  // in (contiguous, numel = sum of counts) reduced over ranks; rank r receives elements
  // [sum(counts[0..r)), + counts[r]) into out (numel counts[r]). Equal counts when counts is empty
  // (then in.numel() must be world_size * out.numel()).
  virtual void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const std::vector<int64_t>& counts = {}) = 0;
  // out (numel world_size * in.numel()) receives every rank's in, in rank order.
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // root's t overwrites t on every rank.
  virtual void broadcast(Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  // Everything issued so far has finished for the caller: for MPI, on the host; for NCCL, the
  // compute stream waits for the communication stream (no host synchronization).
  virtual void wait() = 0;
  // Collectives issued so far: the k-th one issued (from 1) is ticket k.
  virtual int64_t issued() const = 0;
  // As wait(), for the collectives up to ticket `ticket` only (later ones may still run), and their
  // tensors, which a collective keeps alive until waited for, are released: a reducer frees each
  // bucket once its collective is done instead of holding every bucket to the end of backward.
  // A ticket already covered by an earlier wait is a no-op.
  virtual void wait_until(int64_t ticket) = 0;
};

// Seconds a collective may take before the watchdog declares the job dead (--dist-timeout).
constexpr double kDefaultTimeoutSeconds = 300;

}  // namespace loom::dist
