// Mixture-of-experts functions: routing, the gather of each token's rows by expert, the weighted
// combine and the load-balancing loss, forward and backward side by side (the per-expert products
// are fn_grouped.cpp's).
#include "autograd/functions.h"
#include "autograd/lambda_node.h"

namespace loom::ag {
using detail::Grads;
using detail::node_of;

namespace {

// y [T, H] = the sum of each token's K rows of ys [T K, H] (row_of: ops::MoeDispatch's), unit
// weights through ops::moe_combine: deterministic, no atomics.
Tensor sum_token_rows(const Tensor& ys, const Tensor& row_of, int64_t k) {
  Tensor ones = Tensor::empty({row_of.numel() / k, k}, ops::acc_dtype(ys.dtype()), ys.device());
  ops::fill_(ones, 1.f);
  return ops::moe_combine(ys, row_of, ones);
}

}  // namespace

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

Variable moe_gather(const Variable& x, const ops::MoeDispatch& d, int64_t k) {
  const Tensor tokens = d.token_of_row.to(x.value().device()), rows = d.row_of.to(x.value().device());
  auto backward = [rows, k](Node&, const Grads& g) {
    return Grads{sum_token_rows(g[0], rows, k)};  // dx[t] = sum over j of dxs[row_of[t K + j]]
  };
  return record1(node_of("moe_gather", backward), {&x}, ops::embedding(tokens, x.value()));
}

Variable moe_combine(const Variable& ys, const Variable& weights, const Tensor& row_of, const InputFn& recompute_ys) {
  const Tensor w = weights.value();
  const Tensor y = ops::moe_combine(ys.value(), row_of, w);
  const Tensor keep = recompute_ys ? Tensor() : ys.value();
  auto backward = [keep, recompute_ys, w, row_of](Node&, const Grads& g) {
    auto [dys, dw] = ops::moe_combine_backward(keep.defined() ? keep : recompute_ys(), row_of, w, g[0]);
    return Grads{dys, dw};
  };
  return record1(node_of("moe_combine", backward), {&ys, &weights}, y);
}

Variable moe_sum(const Variable& ys, const ops::MoeDispatch& d, int64_t k, OutputUse use) {
  const Device dev = ys.value().device();
  const Tensor tokens = d.token_of_row.to(dev), rows = d.row_of.to(dev);
  LOOM_CHECK(k >= 1 && ys.value().dim() == 2 && ys.size(0) == rows.numel() && rows.numel() % k == 0,
             "moe_sum: ys ", ys.value().str(), " for ", rows.numel(), " rows of ", k, " per token");
  const int64_t t = rows.numel() / k;
  const Tensor y = use == OutputUse::kRead ? sum_token_rows(ys.value(), rows, k)
                                           : detail::unread_value({t, ys.size(1)}, ys.dtype(), dev);
  auto backward = [tokens](Node&, const Grads& g) { return Grads{ops::embedding(tokens, g[0])}; };
  return record1(node_of("moe_sum", backward), {&ys}, y);
}

Variable moe_row_weights(const Variable& weights, const ops::MoeDispatch& d) {
  const Tensor w = weights.value();
  const Tensor rows = d.row_of.to(w.device());
  LOOM_CHECK(w.dim() == 2 && w.numel() == rows.numel() && (w.dtype() == DType::f32 || w.dtype() == DType::f64),
             "moe_row_weights: weights ", w.str(), " for ", rows.numel(), " rows (f32 or f64 [T, K])");
  // A scatter through the permutation row_of (one write per row, so exact) and, backward, its gather.
  Tensor wr = Tensor::zeros({rows.numel(), 1}, w.dtype(), w.device());
  ops::embedding_backward(rows, w.contiguous().reshape({rows.numel(), 1}), wr);
  const Shape shape = w.shape();
  auto backward = [rows, shape](Node&, const Grads& g) { return Grads{ops::embedding(rows, g[0]).reshape(shape)}; };
  return record1(node_of("moe_row_weights", backward), {&weights}, wr);
}

}  // namespace loom::ag
