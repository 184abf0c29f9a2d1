// The LoRA linear as one differentiable function: y = x W^T + scale * (dropout(x) A^T) B^T with
// every product a GEMM in the compute dtype (x's) accumulating in f32, and B's product added into
// the base output by the GEMM itself (beta = 1): no casts or extra passes over the activations.
#include "autograd/functions.h"
#include "autograd/lambda_node.h"

namespace loom::ag {
using detail::Grads;
using detail::node_of;

Variable lora_linear(const Variable& x, const Variable& w, const Variable& a, const Variable& b, const LoraArgs& lora,
                     const Variable* bias) {
  const Tensor& xv = x.value();
  LOOM_CHECK(w.value().dim() == 2 && a.value().dim() == 2 && b.value().dim() == 2 && xv.dim() >= 1, "lora_linear: ",
             "x ", xv.str(), ", weight ", w.value().str(), ", lora_A ", a.value().str(), ", lora_B ", b.value().str());
  const int64_t in = w.size(1), out = w.size(0), r = a.size(0);
  LOOM_CHECK(xv.size(-1) == in && a.size(1) == in && b.size(0) == out && b.size(1) == r, "lora_linear: x ", xv.str(),
             " weight ", w.value().str(), " lora_A ", a.value().str(), " lora_B ", b.value().str(),
             " do not chain as [.., in] x [out, in]^T + ([.., in] x [r, in]^T) x [out, r]^T");
  LOOM_CHECK(w.dtype() == xv.dtype(), "lora_linear: weight ", w.value().str(), " and x ", xv.str(), " differ in dtype");
  const DType cdt = xv.dtype();
  Shape out_shape = xv.shape();
  out_shape.back() = out;
  const Tensor x2 = xv.reshape({-1, in});
  const Tensor xd = lora.dropout > 0.f ? ops::dropout(x2, lora.dropout, lora.seed, lora.offset) : x2;
  // The adapter's f32 weights in the compute dtype: [r, in] and [out, r], a few MB at most.
  const Tensor ac = a.value().to(cdt), bc = b.value().to(cdt);
  Tensor y = ops::matmul(x2, w.value(), false, true);  // [n, in] x [out, in]^T -> [n, out]
  if (bias) y = ops::add_bias(y, bias->value());        // the base layer's output, rounded, as PEFT adds to it
  const Tensor t = ops::matmul(xd, ac, false, true);     // [n, in] x [r, in]^T   -> [n, r]
  ops::matmul_into(t, bc, y, false, true, lora.scale, 1.f);  // y += scale * [n, r] x [out, r]^T

  // Backward needs x (for dA, and dW when W trains), W and A (for dx), B and t.
  Tensor keep_w = x.requires_grad() ? w.value() : Tensor();
  Tensor keep_ac = x.requires_grad() ? ac : Tensor();
  const float scale = lora.scale;
  const LoraArgs args = lora;
  const DType a_dtype = a.dtype(), b_dtype = b.dtype(), bias_dtype = bias ? bias->dtype() : DType::f32;
  auto backward = [x2, keep_w, keep_ac, bc, t, scale, args, in, a_dtype, b_dtype, bias_dtype, xshape = xv.shape()](Node& n, const Grads& g) {
    const Tensor dy = g[0].reshape({-1, g[0].size(-1)});  // [n, out]
    Tensor dx, dw, da, db, dbias;
    if (n.needs_grad(3)) {  // dB = scale * dy^T t: [out, n] x [n, r]
      db = Tensor::empty(bc.shape(), b_dtype, dy.device());
      ops::matmul_into(dy, t, db, true, false, scale, 0.f);
    }
    const bool need_dt = n.needs_grad(0) || n.needs_grad(2);
    const Tensor dt = need_dt ? ops::matmul(dy, bc) : Tensor();  // [n, out] x [out, r] (scale applied below)
    if (n.needs_grad(2)) {  // dA = (scale * dy B)^T dropout(x): [r, n] x [n, in]
      const Tensor xd = args.dropout > 0.f ? ops::dropout(x2, args.dropout, args.seed, args.offset) : x2;
      da = Tensor::empty({bc.size(1), in}, a_dtype, dy.device());
      ops::matmul_into(dt, xd, da, true, false, scale, 0.f);
    }
    if (n.needs_grad(0)) {  // dx = dy W + dropout'(scale * dy B A)
      dx = ops::matmul(dy, keep_w);  // [n, out] x [out, in]
      if (args.dropout > 0.f) {
        dx = ops::add(dx, ops::scale(ops::dropout(ops::matmul(dt, keep_ac), args.dropout, args.seed, args.offset), scale));
      } else {
        ops::matmul_into(dt, keep_ac, dx, false, false, scale, 1.f);  // dx += scale * [n, r] x [r, in]
      }
      dx = dx.view(xshape);
    }
    if (n.needs_grad(1)) dw = ops::matmul(dy, x2, true, false);  // full fine-tuning with an adapter: [out, in]
    if (n.needs_grad(4)) dbias = ops::sum_rows(dy, bias_dtype);
    return Grads{dx, dw, da, db, dbias};
  };
  return record1(node_of("lora_linear", backward), {&x, &w, &a, &b, bias}, y.view(out_shape));
}

}  // namespace loom::ag
