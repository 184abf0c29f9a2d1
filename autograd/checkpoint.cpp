// checkpoint(): recompute instead of store. Forward runs without recording and keeps only the
// inputs (optionally moved to pinned host memory); backward re-runs fn on a fresh tape and
// back-propagates through it.
#include "autograd/functions.h"
#include "autograd/lambda_node.h"

namespace loom::ag {
namespace {

class CheckpointNode final : public Node {
 public:
  CheckpointNode(CheckpointFn fn, std::vector<Tensor> saved, std::vector<Device> devices)
      : fn_(std::move(fn)), saved_(std::move(saved)), devices_(std::move(devices)) {}
  const char* name() const override { return "checkpoint"; }

  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override {
    GradModeGuard grad_on(true);
    TapeScope fresh;
    std::vector<Variable> ins;
    for (size_t i = 0; i < saved_.size(); ++i) ins.emplace_back(saved_[i].to(devices_[i]), needs_grad(i));
    saved_.clear();  // the device copies above are all we need now
    std::vector<Variable> outs = fn_(ins);
    LOOM_CHECK(outs.size() == grad_outputs.size(), "checkpoint: recomputation returned ", outs.size(),
               " outputs, forward returned ", grad_outputs.size());
    std::vector<Variable> roots;
    std::vector<Tensor> grads;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (outs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    ag::backward(roots, grads);
    std::vector<Tensor> result;
    for (auto& v : ins) result.push_back(v.requires_grad() ? v.grad() : Tensor());
    return result;
  }

 private:
  CheckpointFn fn_;
  std::vector<Tensor> saved_;
  std::vector<Device> devices_;
};

}  // namespace

std::vector<Variable> checkpoint(const CheckpointFn& fn, const std::vector<Variable>& inputs,
                                 const CheckpointOptions& options) {
  std::vector<const Variable*> in_ptrs;
  for (const auto& v : inputs) in_ptrs.push_back(&v);
  std::vector<Variable> outs;
  {
    NoGradGuard no_grad;
    outs = fn(inputs);
  }
  if (!should_record(in_ptrs)) return outs;
  std::vector<Tensor> saved;
  std::vector<Device> devices;
  for (const auto& v : inputs) {
    devices.push_back(v.device());
    if (options.offload && v.value().is_cuda()) {
      Tensor host = Tensor::empty_pinned(v.shape(), v.dtype());
      host.copy_(v.value());
      saved.push_back(host);
    } else {
      saved.push_back(v.value());
    }
  }
  std::vector<Tensor> values;
  for (auto& o : outs) values.push_back(o.value());
  return record(std::make_shared<CheckpointNode>(fn, std::move(saved), std::move(devices)), in_ptrs, std::move(values));
}

}  // namespace loom::ag
