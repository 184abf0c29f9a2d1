// NCCL backend of Communicator (see nccl_communicator.h). Compiled to a stub that throws without
// LOOM_CUDA, so the CPU build never breaks.
#include "dist/nccl_communicator.h"

#include "dist/check.h"

#if LOOM_WITH_CUDA
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

#include "engine/cuda_context.h"
#include "kernels/cuda_check.h"
#endif

namespace loom::dist {

#if LOOM_WITH_CUDA
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
    default: LOOM_CHECK(false, "NCCL: no NCCL type for ", name(t));
  }
  return ncclFloat32;
}

void check_cuda_tensor(const Tensor& t, int device, const char* op) {
  LOOM_CHECK(t.defined() && t.is_cuda() && t.device().index == device && t.is_contiguous(), "NCCL ", op,
             ": needs a contiguous tensor on cuda:", device, ", got ", t.defined() ? t.str() : std::string("undefined"));
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(MPI_Comm mpi, int device, double timeout_s) : device_(device), timeout_s_(timeout_s) {
    LOOM_MPI_CHECK(MPI_Comm_rank(mpi, &rank_));
    LOOM_MPI_CHECK(MPI_Comm_size(mpi, &world_));
    CudaDeviceGuard guard(device_);
    compute_ = reinterpret_cast<cudaStream_t>(CudaContext::get(device_).stream);
    int lo = 0, hi = 0;
    LOOM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    LOOM_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, hi));
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&finished_, cudaEventDisableTiming));
    ncclUniqueId id;
    if (rank_ == 0) LOOM_NCCL_CHECK(ncclGetUniqueId(&id));
    LOOM_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi));
    LOOM_NCCL_CHECK(ncclCommInitRank(&comm_, world_, id, rank_));
    int provided = 0;
    MPI_Query_thread(&provided);
    mpi_abort_ok_ = provided == MPI_THREAD_MULTIPLE;
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    CudaDeviceGuard guard(device_);
    cudaStreamSynchronize(stream_);
    for (auto& e : inflight_) cudaEventDestroy(e.event);
    release(issued_);
    ncclCommDestroy(comm_);
    cudaEventDestroy(ready_);
    cudaEventDestroy(finished_);
    cudaStreamDestroy(stream_);
  }

  std::string backend() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  void all_reduce(Tensor& t, ReduceOp op) override {
    check_cuda_tensor(t, device_, "all_reduce");
    launch("all_reduce of " + t.str(), {t}, [&] {
      LOOM_NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t.dtype()), red(op), comm_, stream_));
    });
  }

  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const std::vector<int64_t>& counts) override {
    check_cuda_tensor(in, device_, "reduce_scatter");
    check_cuda_tensor(out, device_, "reduce_scatter");
    LOOM_CHECK(in.dtype() == out.dtype(), "NCCL reduce_scatter: ", in.str(), " into ", out.str());
    const ncclDataType_t type = nccl_type(in.dtype());
    if (counts.empty()) {
      LOOM_CHECK(in.numel() == out.numel() * world_, "NCCL reduce_scatter: ", in.str(), " into ", out.str(), " over ",
                 world_, " ranks");
      launch("reduce_scatter of " + in.str(), {in, out}, [&] {
        LOOM_NCCL_CHECK(ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), type, red(op), comm_, stream_));
      });
      return;
    }
    LOOM_CHECK(static_cast<int>(counts.size()) == world_, "NCCL reduce_scatter: ", counts.size(), " counts for ", world_,
               " ranks");
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    LOOM_CHECK(in.numel() == total && out.numel() == counts[rank_], "NCCL reduce_scatter: input ", in.str(), " output ",
               out.str(), " do not match the counts");
    // Uneven shares: one reduce to each owner, grouped so NCCL runs them as one operation.
    launch("reduce_scatter (uneven) of " + in.str(), {in, out}, [&] {
      const size_t elem = bytes_for(in.dtype(), 1);
      LOOM_NCCL_CHECK(ncclGroupStart());
      int64_t off = 0;
      for (int r = 0; r < world_; ++r) {
        if (counts[r] > 0) {
          const char* src = static_cast<const char*>(in.data_ptr()) + off * elem;
          LOOM_NCCL_CHECK(ncclReduce(src, r == rank_ ? out.data_ptr() : nullptr, counts[r], type, red(op), r, comm_, stream_));
        }
        off += counts[r];
      }
      LOOM_NCCL_CHECK(ncclGroupEnd());
    });
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check_cuda_tensor(in, device_, "all_gather");
    check_cuda_tensor(out, device_, "all_gather");
    LOOM_CHECK(in.dtype() == out.dtype() && out.numel() == in.numel() * world_, "NCCL all_gather: ", in.str(), " into ",
               out.str(), " over ", world_, " ranks");
    launch("all_gather of " + in.str(), {in, out}, [&] {
      LOOM_NCCL_CHECK(ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), nccl_type(in.dtype()), comm_, stream_));
    });
  }

  void broadcast(Tensor& t, int root) override {
    check_cuda_tensor(t, device_, "broadcast");
    launch("broadcast of " + t.str(), {t}, [&] {
      LOOM_NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t.dtype()), root, comm_, stream_));
    });
  }

  void barrier() override {
    // A one-element all-reduce, then the host waits for it (under the watchdog's deadline).
    Tensor one = Tensor::zeros({1}, DType::f32, Device::cuda(device_));
    all_reduce(one, ReduceOp::kSum);
    wait();
    CudaDeviceGuard guard(device_);
    LOOM_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }

  void wait() override {
    CudaDeviceGuard guard(device_);
    LOOM_CUDA_CHECK(cudaEventRecord(finished_, stream_));
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(compute_, finished_, 0));
    // The pool frees on the compute stream, which now runs after the collectives: safe to drop.
    release(issued_);
  }

  int64_t issued() const override { return issued_; }

  void wait_until(int64_t ticket) override {
    CudaDeviceGuard guard(device_);
    // The communication stream runs in issue order: the compute stream waits for the last
    // collective up to `ticket` (no host synchronisation), then their tensors can go.
    const Kept* last = nullptr;
    for (const Kept& k : keep_) {  // in issue order
      if (k.ticket > ticket) break;
      last = &k;
    }
    if (last == nullptr) return;
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(compute_, last->done, 0));
    release(ticket);
  }

 private:
  struct Inflight {
    cudaEvent_t event;
    std::chrono::steady_clock::time_point deadline;
    std::string what;
  };

  static ncclRedOp_t red(ReduceOp op) { return op == ReduceOp::kAvg ? ncclAvg : ncclSum; }

  // A collective's tensors and the event its end records, until the compute stream waits for it.
  struct Kept {
    int64_t ticket = 0;
    cudaEvent_t done = nullptr;
    std::vector<Tensor> tensors;
  };

  // Drops the tensors of the collectives up to `ticket`: the compute stream (where the pool frees)
  // already waits for them.
  void release(int64_t ticket) {
    while (!keep_.empty() && keep_.front().ticket <= ticket) {
      cudaEventDestroy(keep_.front().done);
      keep_.pop_front();
    }
  }

  template <class F>
  void launch(std::string what, std::vector<Tensor> keep, F&& call) {
    CudaDeviceGuard guard(device_);
    // The watchdog destroys `done` once complete; `kept_done` stays for wait_until. Both exist
    // before the collective is queued.
    cudaEvent_t done, kept_done;
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&kept_done, cudaEventDisableTiming));
    // The communication stream starts after everything queued on the compute stream so far.
    LOOM_CUDA_CHECK(cudaEventRecord(ready_, compute_));
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    call();
    LOOM_CUDA_CHECK(cudaEventRecord(done, stream_));
    LOOM_CUDA_CHECK(cudaEventRecord(kept_done, stream_));
    keep_.push_back({issued_ + 1, kept_done, std::move(keep)});
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++issued_;
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(timeout_s_));
      inflight_.push_back({done, deadline, what + " (collective #" + std::to_string(issued_) + ")"});
    }
    cv_.notify_all();
  }

  // The watchdog: every 50 ms, NCCL's asynchronous error and the oldest collective's deadline.
  void watch() {
    CudaDeviceGuard guard(device_);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(50));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        die(std::string("NCCL reported ") + ncclGetErrorString(async) +
            (inflight_.empty() ? std::string() : " during " + inflight_.front().what));
      while (!inflight_.empty()) {
        const cudaError_t q = cudaEventQuery(inflight_.front().event);
        if (q == cudaErrorNotReady) break;
        if (q != cudaSuccess) die(std::string("CUDA error ") + cudaGetErrorString(q) + " in " + inflight_.front().what);
        cudaEventDestroy(inflight_.front().event);
        inflight_.pop_front();
      }
      if (!inflight_.empty() && std::chrono::steady_clock::now() > inflight_.front().deadline)
        die(inflight_.front().what + " did not complete within the " + std::to_string(static_cast<int>(timeout_s_)) +
            " s deadline (--dist-timeout): another rank died or hangs");
    }
  }

  [[noreturn]] void die(const std::string& why) {
    char host[256] = "?";
    gethostname(host, sizeof host);
    std::fprintf(stderr, "loom dist: rank %d of %d (%s, pid %d, cuda:%d): %s; aborting the NCCL communicator and the job\n",
                 rank_, world_, host, static_cast<int>(getpid()), device_, why.c_str());
    std::fflush(stderr);
    ncclCommAbort(comm_);  // unblocks this rank's kernels so the process can end
    if (mpi_abort_ok_) MPI_Abort(MPI_COMM_WORLD, 3);
    _exit(3);
  }

  int device_ = 0, rank_ = 0, world_ = 1;
  double timeout_s_;
  bool mpi_abort_ok_ = false;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr, compute_ = nullptr;
  cudaEvent_t ready_ = nullptr, finished_ = nullptr;
  std::deque<Kept> keep_;  // inputs and outputs of collectives not yet waited for, in issue order

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t issued_ = 0;
  std::deque<Inflight> inflight_;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, int device, double timeout_s) {
  return std::make_unique<NcclCommunicator>(comm, device, timeout_s);
}

#else

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, int, double) {
  LOOM_CHECK(false, "the NCCL communicator needs CUDA: Loom was built without it (LOOM_CUDA=OFF)");
  return nullptr;
}

#endif

}  // namespace loom::dist
