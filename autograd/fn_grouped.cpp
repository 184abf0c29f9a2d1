// Grouped expert products of mixture-of-experts layers, forward and backward side by side: every
// product one grouped GEMM over all experts (ops::grouped_matmul_into / grouped_matmul_tn_into).
//   y[rows_e] = x[rows_e] w[e]^T:  dx[rows_e] = dy[rows_e] w[e],  dw[e] = dy[rows_e]^T x[rows_e].
#include "autograd/functions.h"
#include "autograd/lambda_node.h"

namespace loom::ag {
using detail::Grads;
using detail::node_of;

namespace {

// The expert weight in the compute dtype: as it is, or an f32 master cast for bf16 activations.
Tensor in_compute_dtype(const char* op, const Tensor& w, DType compute) {
  if (w.dtype() == compute) return w;
  LOOM_CHECK(w.dtype() == DType::f32 && compute == DType::bf16, op, ": weight ", w.str(), " with ", name(compute),
             " inputs (the inputs' dtype, or an f32 master with bf16 inputs)");
  return w.to(compute);
}

void check_shapes(const char* op, const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets) {
  LOOM_CHECK(x.dim() == 2 && w.dim() == 3 && x.size(1) == w.size(2) &&
                 static_cast<int64_t>(offsets.size()) == w.size(0) + 1 && offsets.back() == x.size(0),
             op, ": xs ", x.str(), ", w ", w.str(), " and ", offsets.size(), " offsets do not fit as [N, in], ",
             "[E, out, in] and E + 1 offsets ending at N");
}

}  // namespace

Variable grouped_linear(const Variable& xs, const Variable& w, const std::vector<int64_t>& offsets,
                        const WeightFn& rematerialize) {
  const char* op = "grouped_linear";
  LOOM_CHECK(!rematerialize || !w.requires_grad(), op, ": a re-materialised weight must be frozen");
  const Tensor x = xs.value(), wv = w.value();
  check_shapes(op, x, wv, offsets);
  Tensor y = Tensor::empty({x.size(0), wv.size(1)}, x.dtype(), x.device());
  ops::grouped_matmul_into(x, in_compute_dtype(op, wv, x.dtype()), y, offsets, true);  // [n_e, in] x [out, in]^T
  // dx needs w (cast again in backward rather than kept twice, or made again), dw needs x.
  const Tensor keep_w = xs.requires_grad() && !rematerialize ? wv : Tensor();
  const Tensor keep_x = w.requires_grad() ? x : Tensor();
  auto backward = [keep_x, keep_w, rematerialize, offsets, op, in = x.size(1), wshape = wv.shape(),
                   wdtype = wv.dtype()](Node& n, const Grads& g) {
    const Tensor& dy = g[0];  // [N, out]
    Tensor dx, dw;
    if (n.needs_grad(0)) {  // [n_e, out] x [out, in]
      dx = Tensor::empty({dy.size(0), in}, dy.dtype(), dy.device());
      ops::grouped_matmul_into(dy, in_compute_dtype(op, rematerialize ? rematerialize() : keep_w, dy.dtype()), dx,
                               offsets, false);
    }
    if (n.needs_grad(1)) {  // [out, n_e] x [n_e, in], in w's dtype (f32 for an f32 master)
      dw = Tensor::empty(wshape, wdtype, dy.device());
      ops::grouped_matmul_tn_into(dy, keep_x, dw, offsets);
    }
    return Grads{dx, dw};
  };
  return record1(node_of(op, backward), {&xs, &w}, y);
}

// t = scale * x a_e^T [N, r];  y = x w_e^T + t b_e^T, both products in one accumulation
// (ops::grouped_matmul_dual_into: one launch on Hopper, the adapter's term no product of its own and
// y rounded once). Backward, with dt = scale * dy b_e [N, r]:  db[e] = dy^T t,  da[e] = dt^T x,
// dx = dy w_e + dt a_e (dual again),  dw[e] = dy^T x.
Variable grouped_linear_lora(const Variable& xs, const Variable& w, const Variable& a, const Variable& b, float scale,
                             const std::vector<int64_t>& offsets, const WeightFn& rematerialize) {
  const char* op = "grouped_linear_lora";
  LOOM_CHECK(!rematerialize || !w.requires_grad(), op, ": a re-materialised weight must be frozen");
  const Tensor x = xs.value(), wv = w.value();
  check_shapes(op, x, wv, offsets);
  const int64_t experts = wv.size(0), out = wv.size(1), in = wv.size(2), r = a.value().dim() == 3 ? a.size(1) : 0;
  LOOM_CHECK(r > 0 && a.shape() == Shape({experts, r, in}) && b.shape() == Shape({experts, out, r}), op, ": lora_A ",
             a.value().str(), " and lora_B ", b.value().str(), " must be [E, r, in] and [E, out, r] for w ",
             wv.str());
  const DType cdt = x.dtype();
  const Tensor ac = a.value().to(cdt), bc = b.value().to(cdt);
  const int64_t rows = x.size(0);
  Tensor t = Tensor::empty({rows, r}, cdt, x.device());
  ops::grouped_matmul_into(x, ac, t, offsets, true, scale, 0.f);  // scale [n_e, in] x [r, in]^T
  Tensor y = Tensor::empty({rows, out}, cdt, x.device());
  // [n_e, in] x [out, in]^T + [n_e, r] x [out, r]^T
  ops::grouped_matmul_dual_into(x, in_compute_dtype(op, wv, cdt), t, bc, y, offsets, true);

  const bool need_x = xs.requires_grad(), need_a = a.requires_grad();
  const Tensor keep_x = need_a || w.requires_grad() ? x : Tensor();
  const Tensor keep_t = b.requires_grad() ? t : Tensor();
  const Tensor keep_a = need_x ? ac : Tensor();
  const Tensor keep_b = need_x || need_a ? bc : Tensor();
  const Tensor keep_w = need_x && !rematerialize ? wv : Tensor();
  auto backward = [keep_x, keep_t, keep_a, keep_b, keep_w, rematerialize, offsets, op, scale, in, r, w_shape = wv.shape(),
                   w_dtype = wv.dtype(), a_shape = a.shape(), a_dtype = a.dtype(), b_shape = b.shape(),
                   b_dtype = b.dtype()](
                      Node& n, const Grads& g) {
    const Tensor& dy = g[0];  // [N, out]
    const int64_t rows = dy.size(0);
    Tensor dx, dw, da, db;
    // The adapters' gradients are products in the activations' dtype, cast to the masters' (cuBLAS's
    // grouped call has no bf16 -> f32; PEFT's expert LoRA, a bf16 product of bf16-cast factors, rounds
    // its factors' gradients to bf16 alike): one grouped GEMM instead of one GEMM per expert.
    auto master_grad = [&](const Tensor& lhs, const Tensor& rhs, const Shape& shape, DType dtype) {
      Tensor o = Tensor::empty(shape, lhs.dtype(), lhs.device());
      ops::grouped_matmul_tn_into(lhs, rhs, o, offsets);
      return o.dtype() == dtype ? o : o.to(dtype);
    };
    if (n.needs_grad(3)) db = master_grad(dy, keep_t, b_shape, b_dtype);  // db[e] = dy^T t
    if (n.needs_grad(0) || n.needs_grad(2)) {
      Tensor dt = Tensor::empty({rows, r}, dy.dtype(), dy.device());
      ops::grouped_matmul_into(dy, keep_b, dt, offsets, false, scale, 0.f);  // scale [n_e, out] x [out, r]
      if (n.needs_grad(2)) da = master_grad(dt, keep_x, a_shape, a_dtype);  // da[e] = dt^T x
      if (n.needs_grad(0)) {  // dx = dy w_e + dt a_e: [n_e, out] x [out, in] + [n_e, r] x [r, in]
        dx = Tensor::empty({rows, in}, dy.dtype(), dy.device());
        ops::grouped_matmul_dual_into(dy, in_compute_dtype(op, rematerialize ? rematerialize() : keep_w, dy.dtype()),
                                      dt, keep_a, dx, offsets, false);
      }
    }
    if (n.needs_grad(1)) {  // full fine-tuning beside the adapter: dw[e] = dy^T x
      dw = Tensor::empty(w_shape, w_dtype, dy.device());
      ops::grouped_matmul_tn_into(dy, keep_x, dw, offsets);
    }
    return Grads{dx, dw, da, db};
  };
  return record1(node_of(op, backward), {&xs, &w, &a, &b}, y);
}

}  // namespace loom::ag
