// Internal to autograd/fn_*.cpp: a Node whose backward is a lambda capturing exactly the tensors
// it needs, so forward and backward of a function read side by side.
#pragma once
#include <memory>
#include <type_traits>
#include <vector>

#include "autograd/variable.h"

namespace loom::ag::detail {

template <class F>
class LambdaNode final : public Node {
 public:
  LambdaNode(const char* name, F f) : name_(name), f_(std::move(f)) {}
  const char* name() const override { return name_; }
  std::vector<Tensor> backward(std::vector<Tensor>& g) override { return f_(*this, g); }

 private:
  const char* name_;
  F f_;
};

// f(Node& self, const std::vector<Tensor>& grad_outputs) -> std::vector<Tensor> grad_inputs (or a
// non-const reference, to move a gradient out: see Node::backward)
template <class F>
std::shared_ptr<Node> node_of(const char* name, F&& f) {
  return std::make_shared<LambdaNode<std::decay_t<F>>>(name, std::forward<F>(f));
}

using Grads = std::vector<Tensor>;

}  // namespace loom::ag::detail
