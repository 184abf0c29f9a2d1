// CPU optimizer offload's pipelined host update (see host_update.h).
#include "optim/host_update.h"

#include <exception>
#include <mutex>

#include "kernels/error.h"

namespace loom::optim {
namespace {

// Pipeline stages: ranges of at least kAloneElems run alone (the rule's CPU kernel spreads one
// range over the OpenMP threads); smaller ones are gathered into stages of about kStageElems and
// spread one range per thread. A stage starts as soon as its gradients are down.
constexpr int64_t kAloneElems = int64_t(1) << 18;
constexpr int64_t kStageElems = int64_t(1) << 22;

}  // namespace

Tensor pinned_copy(const Tensor& t, DType dtype) {
  Tensor p = Tensor::empty_pinned(t.shape(), dtype);
  p.copy_(t);
  return p;
}

Tensor HostUpdater::stage(std::map<DType, Tensor>& buffers, DType dtype, int64_t numel) {
  Tensor& b = buffers[dtype];
  if (!b.defined() || b.numel() < numel) {
    b = Tensor();  // back to the pinned cache before the larger block is taken
    b = Tensor::empty_pinned({std::max<int64_t>(numel, 1)}, dtype);
  }
  return b;
}

int64_t HostUpdater::staging_bytes() const {
  int64_t n = 0;
  for (const auto* m : {&grad_stage_, &out_stage_})
    for (const auto& [dtype, t] : *m) n += t.nbytes();
  return n;
}

void HostUpdater::run(UpdateRule& rule, std::vector<HostRange>& ranges) {
  const char* op = "HostUpdater::run";
  const size_t n = ranges.size();
  if (n == 0) return;
  uploaded_.wait();  // the last run's uploads read the staging buffers and the masters
  // Where each range's gradient and (bf16, or from unpinned masters) new weights are staged.
  std::map<DType, int64_t> grad_total, out_total;
  std::vector<int64_t> grad_at(n), out_at(n, -1);
  std::vector<Tensor> grads(n);
  for (size_t i = 0; i < n; ++i) {
    HostRange& r = ranges[i];
    LOOM_CHECK(r.master.defined() && r.master.is_cpu() && r.master.dtype() == DType::f32 && r.master.is_contiguous(),
               op, ": master must be contiguous f32 on the host, got ", r.master.str());
    LOOM_CHECK(r.state != nullptr, op, ": range ", i, " has no state");
    for (const Tensor& t : *r.state) LOOM_CHECK(t.is_cpu(), op, ": state ", t.str(), " is not on the host");
    const int64_t numel = r.master.numel();
    LOOM_CHECK(r.grad.numel() == numel && r.compute.numel() == numel && r.compute.is_contiguous(), op,
               ": grad ", r.grad.str(), " and compute ", r.compute.str(), " must match master ", r.master.str());
    grads[i] = r.grad.contiguous();  // kept alive until its copy is done
    grad_at[i] = grad_total[grads[i].dtype()];
    grad_total[grads[i].dtype()] += numel;
    const bool direct = r.compute.dtype() == DType::f32 && (r.compute.is_cpu() || r.master.storage()->pinned());
    if (!direct) {
      out_at[i] = out_total[r.compute.dtype()];
      out_total[r.compute.dtype()] += numel;
    }
  }
  std::map<DType, Tensor> gbuf, obuf;
  for (auto& [dtype, total] : grad_total) gbuf[dtype] = stage(grad_stage_, dtype, total);
  for (auto& [dtype, total] : out_total) obuf[dtype] = stage(out_stage_, dtype, total);
  std::vector<Tensor> gstage(n), ostage(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = ranges[i].master.numel();
    gstage[i] = gbuf[grads[i].dtype()].narrow(0, grad_at[i], numel);
    if (out_at[i] >= 0) ostage[i] = obuf[ranges[i].compute.dtype()].narrow(0, out_at[i], numel);
  }

  // Stages [first, last) of ranges; every gradient goes down at once, in stage order.
  struct Stage {
    size_t first = 0, last = 0;
    bool closed = false;
    TransferEvent down;
  };
  std::vector<Stage> stages;
  int64_t filled = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = ranges[i].master.numel();
    const bool alone = numel >= kAloneElems;
    if (stages.empty() || stages.back().closed || alone) {
      stages.push_back({i, i, false, {}});
      filled = 0;
    }
    stages.back().last = i + 1;
    filled += numel;
    stages.back().closed = alone || filled >= kStageElems;
  }
  for (Stage& s : stages)
    for (size_t i = s.first; i < s.last; ++i) s.down = copy_to_host_async(grads[i], gstage[i]);

  auto update = [&](size_t i) {
    HostRange& r = ranges[i];
    rule.update(r.master, gstage[i], *r.state, r.args, ostage[i].defined() ? &ostage[i] : nullptr);
  };
  TransferEvent up;
  for (Stage& s : stages) {
    s.down.wait();
    if (s.last - s.first == 1) {
      update(s.first);
    } else {
      std::exception_ptr error;
      std::mutex mu;
      const int64_t first = static_cast<int64_t>(s.first), last = static_cast<int64_t>(s.last);
#pragma omp parallel for schedule(dynamic)
      for (int64_t i = first; i < last; ++i) {
        try {
          update(static_cast<size_t>(i));
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!error) error = std::current_exception();
        }
      }
      if (error) std::rethrow_exception(error);
    }
    for (size_t i = s.first; i < s.last; ++i)
      up = copy_to_device_async(ostage[i].defined() ? ostage[i] : ranges[i].master, ranges[i].compute);
  }
  up.order_compute();  // the uploads share one stream: the last covers them all
  uploaded_ = up;
}

}  // namespace loom::optim
