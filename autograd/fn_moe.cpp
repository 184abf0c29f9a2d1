// Mixture-of-experts functions: routing, the per-expert products and the weighted combine,
// forward and backward side by side.
#include "autograd/functions.h"
#include "autograd/lambda_node.h"

namespace loom::ag {
using detail::Grads;
using detail::node_of;

MoeRouting moe_route(const Variable& logits, int64_t k, bool renorm) {
  MoeRouting r;
  r.route = ops::moe_route(logits.value(), k, renorm);
  Tensor l = logits.value();
  ops::MoeRoute route = r.route;
  auto backward = [l, route, renorm](Node&, const Grads& g) {
    return Grads{ops::moe_route_backward(l, route, g[0], renorm)};
  };
  r.weights = record1(node_of("moe_route", backward), {&logits}, r.route.weights);
  return r;
}

Variable moe_aux_loss(const Variable& logits, const Tensor& ids) {
  Tensor l = logits.value();
  auto backward = [l, ids](Node&, const Grads& g) { return Grads{ops::moe_aux_loss_backward(l, ids, g[0])}; };
  return record1(node_of("moe_aux_loss", backward), {&logits}, ops::moe_aux_loss(l, ids));
}

Variable moe_combine(const Variable& ys, const Variable& weights, const Tensor& row_of) {
  Tensor y = ys.value(), w = weights.value();
  auto backward = [y, w, row_of](Node&, const Grads& g) {
    auto [dys, dw] = ops::moe_combine_backward(y, row_of, w, g[0]);
    return Grads{dys, dw};
  };
  return record1(node_of("moe_combine", backward), {&ys, &weights}, ops::moe_combine(y, row_of, w));
}

Variable grouped_linear(const Variable& xs, const Variable& w, const std::vector<int64_t>& offsets) {
  const Tensor x = xs.value(), wv = w.value();
  LOOM_CHECK(x.dim() == 2 && wv.dim() == 3 && x.size(1) == wv.size(2) &&
                 static_cast<int64_t>(offsets.size()) == wv.size(0) + 1 && offsets.back() == x.size(0),
             "grouped_linear: xs ", x.str(), ", w ", wv.str(), " and ", offsets.size(), " offsets do not fit");
  const int64_t experts = wv.size(0), out = wv.size(1);
  Tensor y = Tensor::zeros({x.size(0), out}, x.dtype(), x.device());
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    Tensor ye = y.narrow(0, offsets[e], n);
    ops::matmul_into(x.narrow(0, offsets[e], n), wv.narrow(0, e, 1).reshape({out, wv.size(2)}), ye, false, true);
  }
  auto backward = [x, wv, offsets](Node& node, const Grads& g) {
    const int64_t E = wv.size(0), o = wv.size(1), in = wv.size(2);
    Tensor dx, dw;
    if (node.needs_grad(0)) dx = Tensor::zeros(x.shape(), x.dtype(), x.device());
    if (node.needs_grad(1)) dw = Tensor::zeros(wv.shape(), wv.dtype(), wv.device());
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = offsets[e + 1] - offsets[e];
      if (n == 0) continue;
      const Tensor dy = g[0].narrow(0, offsets[e], n), we = wv.narrow(0, e, 1).reshape({o, in});
      if (dx.defined()) {
        Tensor dxe = dx.narrow(0, offsets[e], n);
        ops::matmul_into(dy, we, dxe, false, false);
      }
      if (dw.defined()) {
        Tensor dwe = dw.narrow(0, e, 1).reshape({o, in});
        ops::matmul_into(dy, x.narrow(0, offsets[e], n), dwe, true, false);
      }
    }
    return Grads{dx, dw};
  };
  return record1(node_of("grouped_linear", backward), {&xs, &w}, y);
}

}  // namespace loom::ag
