// Fused lm_head + cross-entropy on Variables: the gradients come out of the forward (ops computes
// them chunk by chunk beside the loss), so backward only scales them by the upstream scalar.
#include "autograd/functions.h"
#include "autograd/lambda_node.h"

namespace loom::ag {
using detail::Grads;
using detail::node_of;

Variable linear_cross_entropy(const Variable& h, const Variable& w, const Tensor& targets, float softcap,
                              int32_t ignore_index, int64_t chunk_rows) {
  const bool record = should_record({&h, &w});
  ops::LinearCrossEntropyOptions opt;
  opt.softcap = softcap;
  opt.ignore_index = ignore_index;
  opt.chunk_rows = chunk_rows;
  opt.need_dh = record && h.requires_grad();
  opt.need_dw = record && w.requires_grad();
  ops::LinearCrossEntropyOut r = ops::linear_cross_entropy(h.value(), w.value(), targets, opt);
  if (!record) return Variable(r.loss);
  const DType w_dtype = w.value().dtype();
  Tensor dh = r.dh, dw = r.dw;
  auto backward = [dh, dw, w_dtype](Node& node, const Grads& g) mutable {
    // g[0] is the upstream d(out)/d(loss): an acc-dtype scalar on the device, never read on the host.
    Tensor gh, gw;
    if (node.needs_grad(0) && dh.defined()) {
      ops::scale_by_scalar_(dh, g[0]);
      gh = dh;
    }
    if (node.needs_grad(1) && dw.defined()) {
      ops::scale_by_scalar_(dw, g[0]);
      gw = dw.dtype() == w_dtype ? dw : dw.to(w_dtype);
    }
    dh = Tensor();
    dw = Tensor();
    return Grads{gh, gw};
  };
  return record1(node_of("linear_cross_entropy", backward), {&h, &w}, r.loss);
}

}  // namespace loom::ag
