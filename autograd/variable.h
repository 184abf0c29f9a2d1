// Variable: a tensor value plus, when it requires grad, a shared GradCell that backward()
// accumulates into. Node: one recorded differentiable call, holding only what its backward needs.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace loom::ag {

using GradHook = std::function<void(Tensor& grad)>;

// Gradient bookkeeping shared by all copies of a Variable. Nodes hold inputs' cells strongly and
// outputs' cells weakly, never the values themselves.
struct GradCell {
  Tensor grad;                  // accumulated gradient (leaves keep it; intermediates free it)
  bool is_leaf = true;
  Shape shape;                  // the value's shape and dtype, to check incoming gradients
  DType dtype = DType::f32;
  std::vector<GradHook> hooks;  // leaves: called once the grad is final for this backward()
};

class Variable {
 public:
  Variable() = default;
  // A leaf. requires_grad leaves collect gradients in grad().
  explicit Variable(Tensor value, bool requires_grad = false);

  bool defined() const { return value_.defined(); }
  const Tensor& value() const { return value_; }
  const Shape& shape() const { return value_.shape(); }
  DType dtype() const { return value_.dtype(); }
  Device device() const { return value_.device(); }
  int64_t size(int64_t d) const { return value_.size(d); }

  bool requires_grad() const { return cell_ != nullptr; }
  bool is_leaf() const { return !cell_ || cell_->is_leaf; }
  // The accumulated gradient of a leaf (undefined before the first backward or after zero_grad).
  const Tensor& grad() const;
  void zero_grad();
  // Replaces the value in place (optimizer updates) keeping the gradient cell.
  void set_value(Tensor value);
  // Same value, no gradient tracking.
  Variable detach() const { return Variable(value_, false); }
  // Called with the leaf's final gradient during each backward() (data parallelism hooks in here).
  void add_grad_hook(GradHook hook);

  const std::shared_ptr<GradCell>& cell() const { return cell_; }
  // An intermediate result of a recorded node (used by Node recording only).
  static Variable make_output(Tensor value);

 private:
  Tensor value_;
  std::shared_ptr<GradCell> cell_;
};

class Node {
 public:
  virtual ~Node() = default;
  virtual const char* name() const = 0;
  // Given the gradients of the outputs (undefined where none flowed), returns one gradient per
  // input (undefined for inputs that need none). Saved tensors may be released here. The output
  // gradients are the node's alone: it may move them out (to write into one nothing else holds).
  virtual std::vector<Tensor> backward(std::vector<Tensor>& grad_outputs) = 0;

  std::vector<std::shared_ptr<GradCell>> inputs;  // null for inputs without gradient
  std::vector<std::weak_ptr<GradCell>> outputs;
  // Whether input i needs a gradient (cheap check for backward implementations).
  bool needs_grad(size_t i) const { return i < inputs.size() && inputs[i] != nullptr; }
  // The gradient that other consumers of input i have accumulated so far, handed over for this
  // node to add its own into: only an intermediate's (or a recomputed checkpoint's input's); else
  // undefined. A node that takes it returns the sum as input i's gradient: the cell is left empty,
  // so nothing is counted twice.
  //   kWrite: to add into in place (a GEMM's beta = 1 output instead of a separate add pass), so
  //     only one that is contiguous and held by nothing else (a gradient one node handed to two
  //     inputs is shared and stays put).
  //   kRead: only read (a kernel that writes the sum into a new tensor: rms_norm's backward), so a
  //     shared one too (intermediates' gradients are never modified in place), e.g. the one a
  //     recomputed layer's residual add hands to both its inputs.
  enum class GradUse { kWrite, kRead };
  Tensor take_grad_so_far(size_t i, GradUse use = GradUse::kWrite);
};

}  // namespace loom::ag
