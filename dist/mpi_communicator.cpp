// MPI backend of Communicator (see mpi_communicator.h).
#include "dist/mpi_communicator.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <thread>

#include "dist/check.h"
#include "engine/ops.h"

namespace loom::dist {
namespace {

// MPI has no bf16: a 2-byte type with a user sum that adds in f32 and rounds once.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16* a = static_cast<const bf16*>(in);
  bf16* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

int as_count(int64_t n, const char* op) {
  LOOM_CHECK(n >= 0 && n <= INT_MAX, "MPI ", op, ": ", n, " elements exceed MPI's int counts");
  return static_cast<int>(n);
}

void check_cpu(const Tensor& t, const char* op) {
  LOOM_CHECK(t.defined() && t.is_cpu() && t.is_contiguous(), "MPI ", op, ": needs a contiguous CPU tensor, got ",
             t.defined() ? t.str() : std::string("undefined"));
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s) : timeout_s_(timeout_s) {
  LOOM_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  LOOM_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  LOOM_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  LOOM_MPI_CHECK(MPI_Comm_size(comm_, &world_));
  LOOM_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &bf16_type_));
  LOOM_MPI_CHECK(MPI_Type_commit(&bf16_type_));
  LOOM_MPI_CHECK(MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_sum_));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (!pending_.empty()) {
    try {
      wait();
    } catch (...) {
    }
  }
  MPI_Op_free(&bf16_sum_);
  MPI_Type_free(&bf16_type_);
  MPI_Comm_free(&comm_);
}

namespace {

MPI_Datatype mpi_type(DType t, MPI_Datatype bf16_type) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16: return bf16_type;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    default: LOOM_CHECK(false, "MPI: no MPI type for ", name(t));
  }
  return MPI_DATATYPE_NULL;
}

}  // namespace

void MpiCommunicator::issue(Pending p) {
  p.ticket = ++issued_;
  pending_.push_back(std::move(p));
}

void MpiCommunicator::wait_one(Pending& p) {
  const auto start = std::chrono::steady_clock::now();
  int flag = 0;
  for (int spins = 0;; ++spins) {
    LOOM_MPI_CHECK(MPI_Test(&p.request, &flag, MPI_STATUS_IGNORE));
    if (flag) break;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_s_) {
      char host[256] = "?";
      gethostname(host, sizeof host);
      std::fprintf(stderr,
                   "loom dist: rank %d of %d (%s, pid %d): %s did not complete within the %.0f s deadline "
                   "(--dist-timeout): another rank died or hangs; aborting the job\n",
                   rank_, world_, host, static_cast<int>(getpid()), p.what.c_str(), timeout_s_);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 3);
      _exit(3);  // MPI_Abort does not return; if it ever did, do not hang
    }
    // Yield the core: ranks may share cores with others that are still computing.
    if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(spins > 4096 ? 1000 : 50));
  }
  if (p.done) p.done();
}

void MpiCommunicator::wait() {
  // Move out first: done() callbacks must not see themselves pending.
  std::vector<Pending> pending = std::move(pending_);
  pending_.clear();
  for (Pending& p : pending) wait_one(p);
}

void MpiCommunicator::wait_until(int64_t ticket) {
  // Pending is in issue order; the ones up to `ticket` leave the list before their done() runs.
  size_t n = 0;
  while (n < pending_.size() && pending_[n].ticket <= ticket) ++n;
  std::vector<Pending> ready(std::make_move_iterator(pending_.begin()), std::make_move_iterator(pending_.begin() + n));
  pending_.erase(pending_.begin(), pending_.begin() + n);
  for (Pending& p : ready) wait_one(p);
}

void MpiCommunicator::all_reduce(Tensor& t, ReduceOp op) {
  check_cpu(t, "all_reduce");
  const MPI_Datatype type = mpi_type(t.dtype(), bf16_type_);
  Pending p;
  p.what = "all_reduce of " + t.str() + " (collective #" + std::to_string(issued_ + 1) + ")";
  LOOM_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), as_count(t.numel(), "all_reduce"), type,
                                t.dtype() == DType::bf16 ? bf16_sum_ : MPI_SUM, comm_, &p.request));
  p.keep = {t};
  if (op == ReduceOp::kAvg) p.done = [t, w = world_]() mutable { t.copy_(ops::scale(t, 1.f / static_cast<float>(w))); };
  issue(std::move(p));
}

void MpiCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const std::vector<int64_t>& counts) {
  check_cpu(in, "reduce_scatter");
  check_cpu(out, "reduce_scatter");
  LOOM_CHECK(in.dtype() == out.dtype(), "MPI reduce_scatter: ", in.str(), " into ", out.str());
  std::vector<int> recv(world_);
  int64_t total = 0;
  for (int r = 0; r < world_; ++r) {
    recv[r] = as_count(counts.empty() ? out.numel() : counts.at(r), "reduce_scatter");
    total += recv[r];
  }
  LOOM_CHECK(static_cast<int64_t>(counts.size()) == world_ || counts.empty(), "MPI reduce_scatter: ", counts.size(),
             " counts for ", world_, " ranks");
  LOOM_CHECK(in.numel() == total && out.numel() == recv[rank_], "MPI reduce_scatter: input ", in.str(), " output ",
             out.str(), " do not match the counts (total ", total, ", this rank ", recv[rank_], ")");
  Pending p;
  p.what = "reduce_scatter of " + in.str() + " (collective #" + std::to_string(issued_ + 1) + ")";
  LOOM_MPI_CHECK(MPI_Ireduce_scatter(in.data_ptr(), out.data_ptr(), recv.data(), mpi_type(in.dtype(), bf16_type_),
                                     in.dtype() == DType::bf16 ? bf16_sum_ : MPI_SUM, comm_, &p.request));
  p.keep = {in, out};
  if (op == ReduceOp::kAvg) p.done = [out, w = world_]() mutable { out.copy_(ops::scale(out, 1.f / static_cast<float>(w))); };
  issue(std::move(p));
}

void MpiCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check_cpu(in, "all_gather");
  check_cpu(out, "all_gather");
  LOOM_CHECK(in.dtype() == out.dtype() && out.numel() == in.numel() * world_, "MPI all_gather: ", in.str(), " into ",
             out.str(), " over ", world_, " ranks");
  Pending p;
  p.what = "all_gather of " + in.str() + " (collective #" + std::to_string(issued_ + 1) + ")";
  const int bytes = as_count(in.nbytes(), "all_gather");
  LOOM_MPI_CHECK(MPI_Iallgather(in.data_ptr(), bytes, MPI_BYTE, out.data_ptr(), bytes, MPI_BYTE, comm_, &p.request));
  p.keep = {in, out};
  issue(std::move(p));
}

void MpiCommunicator::broadcast(Tensor& t, int root) {
  check_cpu(t, "broadcast");
  LOOM_CHECK(root >= 0 && root < world_, "MPI broadcast: root ", root, " of ", world_, " ranks");
  Pending p;
  p.what = "broadcast of " + t.str() + " from rank " + std::to_string(root) + " (collective #" +
           std::to_string(issued_ + 1) + ")";
  LOOM_MPI_CHECK(MPI_Ibcast(t.data_ptr(), as_count(t.nbytes(), "broadcast"), MPI_BYTE, root, comm_, &p.request));
  p.keep = {t};
  issue(std::move(p));
}

void MpiCommunicator::barrier() {
  Pending p;
  p.what = "barrier (collective #" + std::to_string(issued_ + 1) + ")";
  LOOM_MPI_CHECK(MPI_Ibarrier(comm_, &p.request));
  issue(std::move(p));
  wait();
}

}  // namespace loom::dist
