// checkpoint(): recompute instead of store. Forward runs without recording and keeps only the
// inputs (optionally offloaded to pinned host memory on a side stream, copied back one checkpoint
// ahead of need, with what the first run stashed for the rerun: autograd/stash.h); backward re-runs
// fn on a fresh tape and back-propagates through it.
#include "autograd/functions.h"
#include "autograd/lambda_node.h"
#include "autograd/short_lived_leaves.h"
#include "autograd/stash.h"
#include "engine/offload.h"

namespace loom::ag {
namespace {

struct Saved {
  std::vector<std::shared_ptr<OffloadedTensor>> inputs;
  detail::Stash stash;  // empty unless the checkpoint stashes
  void prefetch() {
    for (auto& t : inputs) t->prefetch();
    stash.prefetch();
  }
};

// The inputs of the checkpoint recorded just before this one: its backward runs right after this
// one's, so this one's backward starts their copy back (a weak link: nothing is kept alive by it).
thread_local std::weak_ptr<Saved> g_previous_offload;

class CheckpointNode final : public Node {
 public:
  CheckpointNode(CheckpointFn fn, std::shared_ptr<Saved> saved, std::weak_ptr<Saved> previous)
      : fn_(std::move(fn)), saved_(std::move(saved)), previous_(std::move(previous)) {}
  const char* name() const override { return "checkpoint"; }

  std::vector<Tensor> backward(std::vector<Tensor>& grad_outputs) override {
    if (auto prev = previous_.lock()) prev->prefetch();
    GradModeGuard grad_on(true);
    TapeScope fresh;
    std::vector<Variable> ins;
    for (size_t i = 0; i < saved_->inputs.size(); ++i) ins.emplace_back(saved_->inputs[i]->fetch(), needs_grad(i));
    std::vector<const GradCell*> cells;  // their gradients go on to the layer before at once
    for (const Variable& v : ins)
      if (v.cell()) cells.push_back(v.cell().get());
    const detail::ShortLivedLeaves short_lived(std::move(cells));
    std::vector<Variable> outs;
    {
      const detail::StashScope replay(&saved_->stash, /*replay=*/true);
      outs = fn_(ins);
    }
    saved_.reset();  // the rerun's graph holds what it took from the inputs and the stash
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
  std::shared_ptr<Saved> saved_;
  std::weak_ptr<Saved> previous_;
};

// A kept input as a copy in the long-lived pool (engine/memory.h): the previous layer's output it
// copies is freed as the forward moves on, and the copy, held until backward, is not left among the
// next layers' activations, where the recomputed ones could not use the space around it.
Tensor kept_copy(const Tensor& t) {
  if (!t.is_cuda()) return t;
  const LongLivedPoolScope scope;
  return t.clone();
}

}  // namespace

std::vector<Variable> checkpoint(const CheckpointFn& fn, const std::vector<Variable>& inputs,
                                 const CheckpointOptions& options) {
  std::vector<const Variable*> in_ptrs;
  for (const auto& v : inputs) in_ptrs.push_back(&v);
  const bool recording = options.captures_trainable ? grad_enabled() : should_record(in_ptrs);
  // Offloading starts before fn runs, so that the copy down overlaps this checkpoint's compute.
  auto saved = std::make_shared<Saved>();
  if (recording && options.stash_room) saved->stash = detail::Stash(options.stash_room);
  if (recording) {
    for (const auto& v : inputs)
      saved->inputs.push_back(options.offload ? OffloadedTensor::offload(v.value())
                                              : OffloadedTensor::keep(kept_copy(v.value())));
  }
  std::vector<Variable> outs;
  {
    NoGradGuard no_grad;
    const detail::StashScope scope(recording && options.stash_room ? &saved->stash : nullptr, /*replay=*/false);
    outs = fn(inputs);
  }
  if (!recording) return outs;
  std::weak_ptr<Saved> previous = options.offload ? g_previous_offload : std::weak_ptr<Saved>();
  if (options.offload) g_previous_offload = saved;
  std::vector<Tensor> values;
  for (auto& o : outs) values.push_back(o.value());
  return record(std::make_shared<CheckpointNode>(fn, std::move(saved), std::move(previous)), in_ptrs,
                std::move(values), options.captures_trainable);
}

}  // namespace loom::ag
