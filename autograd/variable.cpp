// Variable construction and leaf-gradient access (see variable.h).
#include "autograd/variable.h"

namespace loom::ag {

Variable::Variable(Tensor value, bool requires_grad) : value_(std::move(value)) {
  if (requires_grad) {
    LOOM_CHECK(is_float(value_.dtype()), "a ", value_.str(), " cannot require grad: only float tensors can");
    cell_ = std::make_shared<GradCell>();
    cell_->shape = value_.shape();
    cell_->dtype = value_.dtype();
  }
}

Variable Variable::make_output(Tensor value) {
  Variable v(std::move(value), true);
  v.cell_->is_leaf = false;
  return v;
}

const Tensor& Variable::grad() const {
  static const Tensor kNone;
  return cell_ ? cell_->grad : kNone;
}

void Variable::zero_grad() {
  if (cell_) cell_->grad = Tensor();
}

void Variable::set_value(Tensor value) {
  LOOM_CHECK(value.shape() == value_.shape() && value.dtype() == value_.dtype(), "set_value: ", value.str(),
             " does not match ", value_.str());
  value_ = std::move(value);
}

void Variable::add_grad_hook(GradHook hook) {
  LOOM_CHECK(cell_ && cell_->is_leaf, "grad hooks go on leaves that require grad");
  cell_->hooks.push_back(std::move(hook));
}

}  // namespace loom::ag
