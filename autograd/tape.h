// The tape: recording of differentiable calls, backward(), no-grad scopes. A call is recorded
// only when grad mode is on and one of its inputs requires grad. Tapes nest (checkpoint() runs its
// recomputation on a fresh tape).
#pragma once
#include <memory>
#include <vector>

#include "autograd/variable.h"

namespace loom::ag {

bool grad_enabled();

// Sets grad mode (recording on or off) for its scope.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled);
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

// Disables recording for its scope.
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

// True when grad mode is on and any input requires grad: then the call should be recorded.
bool should_record(const std::vector<const Variable*>& inputs);

// Records node with its inputs; returns the outputs wrapped as Variables (tracked when recorded,
// plain otherwise). Call it after computing the forward values. `always` records whenever grad
// mode is on, also when no input requires grad (a checkpoint whose function captures trainable
// weights).
std::vector<Variable> record(std::shared_ptr<Node> node, const std::vector<const Variable*>& inputs,
                             std::vector<Tensor> outputs, bool always = false);
Variable record1(std::shared_ptr<Node> node, const std::vector<const Variable*>& inputs, Tensor output);

// Runs the tape backwards from root, seeded with grad (ones for a scalar root when undefined),
// accumulating into leaf gradients and releasing each node as soon as it has run. The whole
// current tape is consumed.
void backward(const Variable& root, Tensor grad = Tensor());
// Several roots at once (used by checkpoint()).
void backward(const std::vector<Variable>& roots, const std::vector<Tensor>& grads);

// Adds g into cell's gradient, checking shape and dtype: the one place gradients accumulate.
void accumulate_grad(GradCell& cell, const Tensor& g, const char* from);

// Pushes a fresh tape for its scope (checkpoint recomputation) and restores the outer one after.
class TapeScope {
 public:
  TapeScope();
  ~TapeScope();
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;
};

// Whether this thread is inside a checkpoint's recomputation (a TapeScope): what is recorded now is
// back-propagated as soon as the recomputed function returns, so a value kept for backward here is
// held only through that one checkpoint's backward.
bool recomputing();

// Outputs this thread has recorded unread (OutputUse::kRootOnly, autograd/functions.h) so far:
// what tests count to see that a recomputation skips the work.
int64_t unread_outputs();
namespace detail {
// An unread output's value: the shape, dtype and device the computed one would have, with no memory
// behind it (its data pointer is null).
Tensor unread_value(const Shape& shape, DType dtype, Device device);
}  // namespace detail

// Number of nodes on the current tape (tests, diagnostics).
size_t tape_size();
// Drops everything recorded (e.g. after an evaluation forward with grads on).
void clear_tape();

}  // namespace loom::ag
