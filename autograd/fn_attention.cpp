// Causal attention and mean cross-entropy: forward and backward side by side.
#include <cmath>

#include "autograd/functions.h"
#include "autograd/lambda_node.h"
#include "autograd/stash.h"

namespace loom::ag {
using detail::Grads;
using detail::node_of;

namespace {
// The forward's out and lse: a checkpoint's rerun takes what its first run stashed (the forward is
// deterministic: the same values); the first run stashes them.
ops::AttentionOut attention_out(const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionOptions& opt) {
  ops::AttentionOut r;
  std::optional<std::vector<Tensor>> stashed;
  if (detail::Stash* s = detail::StashScope::reading()) stashed = s->take();
  if (stashed) {
    r.out = (*stashed)[0];
    r.lse = (*stashed)[1];
  } else {
    r = ops::attention(q, k, v, opt);
  }
  if (detail::Stash* s = detail::StashScope::writing()) s->put({r.out, r.lse});
  return r;
}
}  // namespace

Variable attention(const Variable& q, const Variable& k, const Variable& v, const ops::AttentionOptions& opt) {
  const ops::AttentionOut r = attention_out(q.value(), k.value(), v.value(), opt);
  Tensor qv = q.value(), kv = k.value(), vv = v.value(), out = r.out, lse = r.lse;
  auto backward = [qv, kv, vv, out, lse, opt](Node&, const Grads& g) {
    ops::AttentionGrads d = ops::attention_backward(qv, kv, vv, out, g[0], lse, opt);
    return Grads{d.dq, d.dk, d.dv};
  };
  return record1(node_of("attention", backward), {&q, &k, &v}, r.out);
}

Variable rope_attention(const Variable& q, const Variable& k, const Variable& v, const ops::RopeArgs& rope,
                        const ops::AttentionOptions& opt) {
  auto [qr, kr] = ops::rope_pair(q.value(), k.value(), rope.positions, rope.inv_freq, false, rope.mscale);
  const ops::AttentionOut r = attention_out(qr, kr, v.value(), opt);
  Tensor vv = v.value(), out = r.out, lse = r.lse;
  auto backward = [qr = qr, kr = kr, vv, out, lse, rope, opt](Node& n, const Grads& g) {
    ops::AttentionGrads d = ops::attention_backward(qr, kr, vv, out, g[0], lse, opt, &rope);
    Tensor dk = n.needs_grad(1) ? ops::rope_backward(d.dk, rope.positions, rope.inv_freq, rope.mscale) : Tensor();
    return Grads{d.dq, dk, d.dv};
  };
  return record1(node_of("rope_attention", backward), {&q, &k, &v}, r.out);
}

Variable cross_entropy(const Variable& logits, const Tensor& targets, float softcap, int32_t ignore_index) {
  int64_t count = 0;
  for (int32_t t : targets.to_ints()) count += t != ignore_index;
  ops::CrossEntropyOut r = ops::cross_entropy(logits.value(), targets, softcap, ignore_index);
  const DType acc = r.loss.dtype();
  const float inv = count > 0 ? 1.f / static_cast<float>(count) : 0.f;
  Tensor mean;
  if (acc == DType::f64) {  // CPU gradient checks: sum in f64
    double s = 0;
    for (double x : r.loss.to_doubles()) s += x;
    mean = Tensor::from_doubles({count > 0 ? s / static_cast<double>(count) : 0.0}, {});
  } else {
    mean = ops::scale(ops::sum(r.loss), inv);
  }
  Tensor lv = logits.value(), lse = r.lse;
  auto backward = [lv, targets, lse, softcap, ignore_index, count, acc](Node&, const Grads& g) {
    // d loss_i = g / count for every row (ignored rows get zero gradient in the kernel).
    const double per_row = count > 0 ? g[0].to_doubles()[0] / static_cast<double>(count) : 0.0;
    Tensor dloss = acc == DType::f64
                       ? Tensor::from_doubles(std::vector<double>(lv.size(0), per_row), {lv.size(0)})
                       : Tensor::full({lv.size(0)}, static_cast<float>(per_row), acc, lv.device());
    return Grads{ops::cross_entropy_backward(lv, targets, lse, dloss, softcap, ignore_index)};
  };
  return record1(node_of("cross_entropy", backward), {&logits}, mean);
}

}  // namespace loom::ag
