// RMSNorm, rotary embedding, gated activations and embedding lookup: forward and backward side
// by side. Weight gradients are computed in the accumulation dtype and cast to the weight's.
#include "autograd/functions.h"
#include "autograd/lambda_node.h"

namespace loom::ag {
using detail::Grads;
using detail::node_of;

Variable rms_norm(const Variable& x, const Variable& w, float eps, bool add_one, int64_t spare) {
  ops::RmsNormOut r = ops::rms_norm(x.value(), w.value(), eps, add_one, spare);
  Tensor xv = x.value(), wv = w.value(), rstd = r.rstd;
  auto backward = [xv, wv, rstd, add_one](Node& n, const Grads& g) {
    Tensor dw;
    if (n.needs_grad(1)) dw = Tensor::zeros({wv.numel()}, ops::acc_dtype(wv.dtype()), wv.device());
    // x's gradient from its other consumers so far (a pre-norm block's residual add, whose backward
    // ran first), added in the norm's own pass instead of by the tape afterwards: the same bits as
    // the tape's add, one [tokens, hidden] add a layer fewer (the 1B step's 16 of 67 us, H100).
    // Only read: also when shared, as a recomputed layer's residual add hands it to both inputs.
    const Tensor so_far = n.take_grad_so_far(0, Node::GradUse::kRead);
    Tensor dx = ops::rms_norm_backward(xv, wv, rstd, g[0], dw.defined() ? &dw : nullptr, add_one,
                                       so_far.defined() ? &so_far : nullptr);
    if (dw.defined() && dw.dtype() != wv.dtype()) dw = dw.to(wv.dtype());
    return Grads{n.needs_grad(0) ? dx : Tensor(), dw};
  };
  return record1(node_of("rms_norm", backward), {&x, &w}, r.y);
}

std::pair<Variable, Variable> add_rms_norm(const Variable& x, const Variable& r, const Variable& w, float eps,
                                           bool add_one, int64_t spare) {
  ops::AddRmsNormOut o = ops::add_rms_norm(x.value(), r.value(), w.value(), eps, add_one, spare);
  Tensor hv = o.h, wv = w.value(), rstd = o.rstd;
  auto backward = [hv, wv, rstd, add_one](Node& n, const Grads& g) {
    // g[0]: h's gradient from the residual stream; g[1]: the norm output's. Either may be absent.
    Tensor dw, dh;
    if (n.needs_grad(2) && g[1].defined()) dw = Tensor::zeros({wv.numel()}, ops::acc_dtype(wv.dtype()), wv.device());
    if (g[1].defined()) {
      dh = ops::rms_norm_backward(hv, wv, rstd, g[1], dw.defined() ? &dw : nullptr, add_one,
                                  g[0].defined() ? &g[0] : nullptr);
    } else {
      dh = g[0];
    }
    if (dw.defined() && dw.dtype() != wv.dtype()) dw = dw.to(wv.dtype());
    return Grads{n.needs_grad(0) ? dh : Tensor(), n.needs_grad(1) ? dh : Tensor(), dw};
  };
  std::vector<Variable> out = record(node_of("add_rms_norm", backward), {&x, &r, &w}, {o.h, o.y});
  return {out[0], out[1]};
}

Variable rope(const Variable& x, const Tensor& positions, const Tensor& inv_freq, float mscale) {
  auto backward = [positions, inv_freq, mscale](Node&, const Grads& g) {
    return Grads{ops::rope_backward(g[0], positions, inv_freq, mscale)};
  };
  return record1(node_of("rope", backward), {&x}, ops::rope(x.value(), positions, inv_freq, mscale));
}

std::pair<Variable, Variable> rope_qk(const Variable& q, const Variable& k, const Tensor& positions,
                                      const Tensor& inv_freq, float mscale) {
  auto backward = [positions, inv_freq, mscale](Node&, const Grads& g) {
    auto [dq, dk] = ops::rope_pair(g[0], g[1], positions, inv_freq, true, mscale);
    return Grads{dq, dk};
  };
  auto [qr, kr] = ops::rope_pair(q.value(), k.value(), positions, inv_freq, false, mscale);
  std::vector<Variable> out = record(node_of("rope_qk", backward), {&q, &k}, {qr, kr});
  return {out[0], out[1]};
}

Variable swiglu(const Variable& gate, const Variable& up) {
  Tensor gv = gate.value(), uv = up.value();
  // The node hands gate and up over (it runs once): where nothing else holds them, their buffers
  // take the gradients.
  auto backward = [gv, uv](Node&, const Grads& g) mutable {
    auto [dg, du] = ops::swiglu_backward_consuming(std::move(gv), std::move(uv), g[0]);
    return Grads{dg, du};
  };
  return record1(node_of("swiglu", backward), {&gate, &up}, ops::swiglu(gv, uv));
}

Variable geglu(const Variable& gate, const Variable& up) {
  Tensor gv = gate.value(), uv = up.value();
  // The node hands gate and up over (it runs once): where nothing else holds them, their buffers
  // take the gradients.
  auto backward = [gv, uv](Node&, const Grads& g) mutable {
    auto [dg, du] = ops::geglu_backward_consuming(std::move(gv), std::move(uv), g[0]);
    return Grads{dg, du};
  };
  return record1(node_of("geglu", backward), {&gate, &up}, ops::geglu(gv, uv));
}

Variable embedding(const Tensor& ids, const Variable& table) {
  const Shape table_shape = table.shape();
  const DType table_dtype = table.dtype();
  auto backward = [ids, table_shape, table_dtype](Node&, const Grads& g) {
    Tensor dtable = Tensor::zeros(table_shape, ops::acc_dtype(table_dtype), g[0].device());
    ops::embedding_backward(ids, g[0], dtable);
    return Grads{dtable.dtype() == table_dtype ? dtable : dtable.to(table_dtype)};
  };
  return record1(node_of("embedding", backward), {&table}, ops::embedding(ids, table.value()));
}

}  // namespace loom::ag
