// Matrix products: forward and backward side by side.
//   C = op(A) op(B):  d op(A) = dC op(B)^T,  d op(B) = op(A)^T dC.
#include "autograd/functions.h"
#include "autograd/lambda_node.h"

namespace loom::ag {
using detail::Grads;
using detail::node_of;

namespace {

// The shape ops::matmul(a, b, ta, tb) returns (a's leading dims, op(a)'s rows, op(b)'s columns),
// after the checks an unread product still needs: matrices of one dtype on one device whose inner
// dimensions agree (ops::matmul checks the batch dims when it computes).
Shape product_shape(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  LOOM_CHECK(a.dim() >= 2 && b.dim() >= 2 && a.dtype() == b.dtype() && a.device() == b.device() &&
                 (ta ? a.size(-2) : a.size(-1)) == (tb ? b.size(-1) : b.size(-2)),
             "matmul: ", a.str(), (ta ? "^T" : ""), " x ", b.str(), (tb ? "^T" : ""), " is not a product");
  Shape s = a.shape();
  s[s.size() - 2] = ta ? a.size(-1) : a.size(-2);
  s.back() = tb ? b.size(-2) : b.size(-1);
  return s;
}

}  // namespace

Variable matmul(const Variable& a, const Variable& b, bool ta, bool tb, OutputUse use) {
  const bool shared_b = b.value().dim() == 2 && a.value().dim() > 2;
  LOOM_CHECK(!(shared_b && ta && b.requires_grad()), "matmul: the gradient of a shared 2-D b with trans_a is not ",
             "supported; reshape a to 2-D first");
  // dA needs B, dB needs A: keep each only if the other side needs a gradient.
  Tensor keep_a = b.requires_grad() ? a.value() : Tensor();
  Tensor keep_b = a.requires_grad() ? b.value() : Tensor();
  auto backward = [keep_a, keep_b, ta, tb, shared_b](Node& n, const Grads& g) {
    const Tensor& dc = g[0];
    Tensor da, db;
    if (n.needs_grad(0)) {
      // !ta: dA = dC op(B)^T        ta: dA = op(B) dC^T
      da = ta ? ops::matmul(keep_b, dc, tb, true) : ops::matmul(dc, keep_b, false, !tb);
    }
    if (n.needs_grad(1)) {
      if (shared_b) {  // sum over the batch: flatten [batch, m, *] to [batch*m, *]
        Tensor a2 = keep_a.reshape({-1, keep_a.size(-1)}), dc2 = dc.reshape({-1, dc.size(-1)});
        db = tb ? ops::matmul(dc2, a2, true, false) : ops::matmul(a2, dc2, true, false);
      } else {
        // !tb: dB = op(A)^T dC      tb: dB = dC^T op(A)
        db = tb ? ops::matmul(dc, keep_a, true, ta) : ops::matmul(keep_a, dc, !ta, false);
      }
    }
    return Grads{da, db};
  };
  Tensor c = use == OutputUse::kRead
                 ? ops::matmul(a.value(), b.value(), ta, tb)
                 : detail::unread_value(product_shape(a.value(), b.value(), ta, tb), a.dtype(), a.value().device());
  return record1(node_of("matmul", backward), {&a, &b}, std::move(c));
}

Variable linear(const Variable& x, const Variable& w, const Variable* bias, OutputUse use) {
  // An unread output with a bias: the product's value is read by the bias's add.
  Variable y = matmul(x, w, false, true, bias ? OutputUse::kRead : use);
  return bias ? add_bias(y, *bias) : y;
}

}  // namespace loom::ag
