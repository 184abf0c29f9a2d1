// DDP buckets (see ddp.h) and the hook plumbing shared by every Reducer (reducer.h).
#include "dist/ddp.h"

#include "engine/ops.h"

namespace loom::dist {

void attach_grad_hooks(Reducer& reducer, const std::vector<ag::Variable>& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    ag::Variable v = params[i];
    v.add_grad_hook([&reducer, i](Tensor& g) {
      if (reducer.sync()) reducer.add(static_cast<int>(i), g);
    });
  }
}

void broadcast_params(Communicator& comm, const std::vector<ag::Variable>& params, int root) {
  for (const ag::Variable& v : params) {
    Tensor t = v.value();
    LOOM_CHECK(t.is_contiguous(), "broadcast_params: ", t.str(), " is not contiguous");
    comm.broadcast(t, root);
  }
  comm.wait();
}

DdpReducer::DdpReducer(Communicator& comm, std::vector<ag::Variable> params, int64_t bucket_bytes)
    : comm_(comm), params_(std::move(params)) {
  const int n = static_cast<int>(params_.size());
  bucket_of_.assign(n, -1);
  slot_of_.assign(n, -1);
  arrived_.assign(n, false);
  for (int i = n - 1; i >= 0; --i) {  // backward produces the last-registered gradients first
    const Tensor& v = params_[i].value();
    LOOM_CHECK(params_[i].requires_grad(), "DdpReducer: parameter ", i, " does not require grad");
    const int64_t bytes = v.nbytes();
    if (buckets_.empty() || buckets_.back().dtype != v.dtype() || buckets_.back().device != v.device() ||
        (bytes_for(v.dtype(), buckets_.back().numel) + bytes > bucket_bytes && !buckets_.back().params.empty())) {
      buckets_.emplace_back();
      buckets_.back().dtype = v.dtype();
      buckets_.back().device = v.device();
    }
    Bucket& b = buckets_.back();
    bucket_of_[i] = static_cast<int>(buckets_.size()) - 1;
    slot_of_[i] = static_cast<int>(b.params.size());
    b.params.push_back(i);
    b.offsets.push_back(b.numel);
    b.numel += v.numel();
  }
}

Tensor DdpReducer::slot(Bucket& b, int k) {
  if (!b.buffer.defined()) b.buffer = Tensor::empty({b.numel}, b.dtype, b.device);
  const Tensor& v = params_[b.params[k]].value();
  return b.buffer.narrow(0, b.offsets[k], v.numel()).view(v.shape());
}

void DdpReducer::add(int index, Tensor& grad) {
  LOOM_CHECK(index >= 0 && index < static_cast<int>(params_.size()), "DdpReducer::add: no parameter ", index);
  LOOM_CHECK(!arrived_[index], "DdpReducer::add: parameter ", index, " reported twice in one step");
  Bucket& b = buckets_[bucket_of_[index]];
  Tensor dst = slot(b, slot_of_[index]);
  dst.copy_(grad);
  grad = dst;  // the gradient becomes a view of its bucket: the reduced sum lands in it in place
  arrived_[index] = true;
  ++b.ready;
  launch_ready();
}

void DdpReducer::launch_ready() {
  while (next_ < buckets_.size() && buckets_[next_].ready == static_cast<int>(buckets_[next_].params.size())) {
    Bucket& b = buckets_[next_++];
    comm_.all_reduce(b.buffer, ReduceOp::kSum);
    b.launched = true;
  }
}

void DdpReducer::finalize() {
  for (size_t bi = next_; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    for (size_t k = 0; k < b.params.size(); ++k) {
      const int i = b.params[k];
      if (arrived_[i]) continue;
      // No gradient this backward (a rank whose last micro-batch had nothing to learn from): what
      // accumulated earlier, or zeros, joins the sum.
      Tensor dst = slot(b, static_cast<int>(k));
      ag::GradCell& cell = *params_[i].cell();
      if (cell.grad.defined()) dst.copy_(cell.grad);
      else ops::fill_(dst, 0.f);
      cell.grad = dst;
      arrived_[i] = true;
      ++b.ready;
    }
  }
  launch_ready();
  comm_.wait();
  for (Bucket& b : buckets_) {
    b.buffer = Tensor();  // the gradients keep it alive until zero_grad; next step takes a fresh one
    b.ready = 0;
    b.launched = false;
  }
  arrived_.assign(params_.size(), false);
  next_ = 0;
}

}  // namespace loom::dist
