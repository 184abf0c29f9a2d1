// Grouped expert products of mixture-of-experts layers, forward and backward side by side: every
// product one grouped GEMM over all experts (ops::grouped_matmul_into / grouped_matmul_tn_into), or
// over `chunk` experts at a time for a weight made on demand (ExpertWeightFn).
//   y[rows_e] = x[rows_e] w[e]^T:  dx[rows_e] = dy[rows_e] w[e],  dw[e] = dy[rows_e]^T x[rows_e].
#include <algorithm>

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

void check_shapes(const char* op, const Tensor& x, const Shape& w, const std::vector<int64_t>& offsets) {
  LOOM_CHECK(x.dim() == 2 && w.size() == 3 && x.size(1) == w[2] &&
                 static_cast<int64_t>(offsets.size()) == w[0] + 1 && offsets.back() == x.size(0),
             op, ": xs ", x.str(), ", w ", shape_str(w), " and ", offsets.size(), " offsets do not fit as [N, in], ",
             "[E, out, in] and E + 1 offsets ending at N");
}

// Experts [first, first + n) of a product: their rows [offsets[first], offsets[first + n]) and those
// rows' offsets from 0.
struct Chunk {
  int64_t first = 0, n = 0, experts = 0, row0 = 0, rows = 0;
  std::vector<int64_t> offsets;
  // t's rows of these experts (t [N, ...]), or t's experts (t [E, ...]): views, t itself when whole.
  Tensor rows_of(const Tensor& t) const { return n == experts ? t : t.narrow(0, row0, rows); }
  Tensor experts_of(const Tensor& t) const { return n == experts ? t : t.narrow(0, first, n); }
};

// The expert weight as a product sees it: the tensor forward was given (kept for backward when it
// needs it), or experts made a chunk at a time.
struct Weight {
  Tensor whole;       // [E, out, in], or undefined
  ExpertWeightFn fn;  // when whole is undefined
  const Shape& shape() const { return whole.defined() ? whole.shape() : fn.shape; }
  // body(w [n, out, in] in dtype, chunk) for every chunk of experts with rows, in order (backward:
  // in reverse, so that its first chunk is the one its forward made last, which a maker may still
  // hold); the chunk's weight is let go before the next is made.
  template <class Body>
  void each_chunk(const char* op, DType dtype, const std::vector<int64_t>& offsets, bool reverse,
                  const Body& body) const {
    const int64_t experts = shape()[0];
    if (experts == 0) return;
    const int64_t step = whole.defined() || fn.chunk <= 0 ? experts : std::min(fn.chunk, experts);
    const int64_t chunks = (experts + step - 1) / step;
    for (int64_t i = 0; i < chunks; ++i) {
      const int64_t first = (reverse ? chunks - 1 - i : i) * step;
      Chunk c;
      c.first = first, c.n = std::min(step, experts - first), c.experts = experts, c.row0 = offsets[first];
      c.rows = offsets[first + c.n] - c.row0;
      if (c.n < experts && c.rows == 0) continue;  // no rows: nothing to compute, nothing to make
      for (int64_t e = 0; e <= c.n; ++e) c.offsets.push_back(offsets[first + e] - c.row0);
      if (whole.defined()) {
        body(in_compute_dtype(op, whole, dtype), c);
      } else {
        const Tensor w = fn.make(first, c.n, dtype);
        LOOM_CHECK(w.shape() == Shape({c.n, shape()[1], shape()[2]}) && w.dtype() == dtype, op, ": made experts ",
                   w.str(), " for ", c.n, " of ", shape_str(shape()), " in ", name(dtype));
        body(w, c);
      }
    }
  }
};

Weight weight_of(const Variable& w) { return Weight{w.value(), {}}; }
Weight weight_of(const ExpertWeightFn& w) {
  LOOM_CHECK(w.make && w.shape.size() == 3, "grouped products: an ExpertWeightFn needs a make and an [E, out, in] shape, got ",
             shape_str(w.shape));
  return Weight{Tensor(), w};
}

enum class Pass { kForward, kBackward };

// Forward y[rows_e] = x[rows_e] w[e]^T, backward dx[rows_e] = dy[rows_e] w[e], into out.
void product(const char* op, const Weight& w, const Tensor& x, Tensor& out, const std::vector<int64_t>& offsets,
             Pass pass) {
  const bool backward = pass == Pass::kBackward;
  w.each_chunk(op, x.dtype(), offsets, backward, [&](const Tensor& wc, const Chunk& c) {
    Tensor oc = c.rows_of(out);
    ops::grouped_matmul_into(c.rows_of(x), wc, oc, c.offsets, /*trans_b=*/!backward);
  });
}

// product's plus a second term in the same accumulation (ops::grouped_matmul_dual_into): forward
// x[rows_e] w[e]^T + x2[rows_e] w2[e]^T, backward dy[rows_e] w[e] + x2[rows_e] w2[e]; w2 [E, ...].
void dual_product(const char* op, const Weight& w, const Tensor& x, const Tensor& x2, const Tensor& w2, Tensor& out,
                  const std::vector<int64_t>& offsets, Pass pass) {
  const bool backward = pass == Pass::kBackward;
  w.each_chunk(op, x.dtype(), offsets, backward, [&](const Tensor& wc, const Chunk& c) {
    Tensor oc = c.rows_of(out);
    ops::grouped_matmul_dual_into(c.rows_of(x), wc, c.rows_of(x2), c.experts_of(w2), oc, c.offsets,
                                  /*trans_b=*/!backward);
  });
}

// grouped_linear with w's Variable (trained, or frozen and kept) or, when w_var is null, w made by its fn.
Variable grouped_linear_of(const Variable& xs, const Variable* w_var, const Weight& w,
                           const std::vector<int64_t>& offsets, OutputUse use, const InputFn& recompute_x) {
  const char* op = "grouped_linear";
  const Tensor x = xs.value();
  check_shapes(op, x, w.shape(), offsets);
  Tensor y;
  if (use == OutputUse::kRead) {
    y = Tensor::empty({x.size(0), w.shape()[1]}, x.dtype(), x.device());
    product(op, w, x, y, offsets, Pass::kForward);  // [n_e, in] x [out, in]^T
  } else {
    y = detail::unread_value({x.size(0), w.shape()[1]}, x.dtype(), x.device());
  }
  // dx needs w (a kept one cast again in backward rather than kept twice, or made again), dw needs x.
  const bool has_w = w_var != nullptr, train_w = has_w && w_var->requires_grad();
  const Weight keep_w = xs.requires_grad() ? w : Weight{};
  const Tensor keep_x = train_w && !recompute_x ? x : Tensor();
  auto backward = [keep_x, recompute_x, keep_w, offsets, op, has_w, in = x.size(1), wshape = w.shape(),
                   wdtype = w.whole.defined() ? w.whole.dtype() : x.dtype()](Node& n, const Grads& g) {
    const Tensor& dy = g[0];  // [N, out]
    Tensor dx, dw;
    if (has_w && n.needs_grad(1)) {  // [out, n_e] x [n_e, in], in w's dtype (f32 for an f32 master)
      dw = Tensor::empty(wshape, wdtype, dy.device());
      // (first: an input made again is let go before dx exists)
      ops::grouped_matmul_tn_into(dy, keep_x.defined() ? keep_x : recompute_x(), dw, offsets);
    }
    if (n.needs_grad(0)) {  // [n_e, out] x [out, in]
      dx = Tensor::empty({dy.size(0), in}, dy.dtype(), dy.device());
      product(op, keep_w, dy, dx, offsets, Pass::kBackward);
    }
    return has_w ? Grads{dx, dw} : Grads{dx};
  };
  if (has_w) return record1(node_of(op, backward), {&xs, w_var}, y);
  return record1(node_of(op, backward), {&xs}, y);
}

// t = scale * x a_e^T [N, r];  y = x w_e^T + t b_e^T, both products in one accumulation
// (ops::grouped_matmul_dual_into: one launch on Hopper, the adapter's term no product of its own and
// y rounded once). Backward, with dt = scale * dy b_e [N, r]:  db[e] = dy^T t,  da[e] = dt^T x,
// dx = dy w_e + dt a_e (dual again),  dw[e] = dy^T x. w as in grouped_linear_of.
Variable grouped_linear_lora_of(const Variable& xs, const Variable* w_var, const Weight& w, const Variable& a,
                                const Variable& b, float scale, const std::vector<int64_t>& offsets, OutputUse use,
                                const InputFn& recompute_x) {
  const char* op = "grouped_linear_lora";
  const Tensor x = xs.value();
  check_shapes(op, x, w.shape(), offsets);
  const int64_t experts = w.shape()[0], out = w.shape()[1], in = w.shape()[2];
  const int64_t r = a.value().dim() == 3 ? a.size(1) : 0;
  LOOM_CHECK(r > 0 && a.shape() == Shape({experts, r, in}) && b.shape() == Shape({experts, out, r}), op, ": lora_A ",
             a.value().str(), " and lora_B ", b.value().str(), " must be [E, r, in] and [E, out, r] for w ",
             shape_str(w.shape()));
  const DType cdt = x.dtype();
  const Tensor ac = a.value().to(cdt), bc = b.value().to(cdt);
  const int64_t rows = x.size(0);
  Tensor t = Tensor::empty({rows, r}, cdt, x.device());
  ops::grouped_matmul_into(x, ac, t, offsets, true, scale, 0.f);  // scale [n_e, in] x [r, in]^T
  Tensor y;
  if (use == OutputUse::kRead) {
    y = Tensor::empty({rows, out}, cdt, x.device());
    dual_product(op, w, x, t, bc, y, offsets, Pass::kForward);  // [n_e, in] x [out, in]^T + [n_e, r] x [out, r]^T
  } else {
    y = detail::unread_value({rows, out}, cdt, x.device());
  }

  const bool has_w = w_var != nullptr, train_w = has_w && w_var->requires_grad();
  const bool need_x = xs.requires_grad(), need_a = a.requires_grad();
  const Tensor keep_x = (need_a || train_w) && !recompute_x ? x : Tensor();
  const Tensor keep_t = b.requires_grad() ? t : Tensor();
  const Tensor keep_a = need_x ? ac : Tensor();
  const Tensor keep_b = need_x || need_a ? bc : Tensor();
  const Weight keep_w = need_x ? w : Weight{};
  auto backward = [keep_x, recompute_x, keep_t, keep_a, keep_b, keep_w, offsets, op, scale, in, r, has_w,
                   w_shape = w.shape(),
                   w_dtype = w.whole.defined() ? w.whole.dtype() : cdt, a_shape = a.shape(), a_dtype = a.dtype(),
                   b_shape = b.shape(), b_dtype = b.dtype()](Node& n, const Grads& g) {
    const Tensor& dy = g[0];  // [N, out]
    const int64_t rows = dy.size(0);
    // Inputs: xs, (w), a, b.
    const size_t ia = has_w ? 2 : 1, ib = ia + 1;
    Tensor dx, dw, da, db;
    Tensor x = keep_x;  // made again here when the forward's was not kept
    if (!x.defined() && recompute_x && (n.needs_grad(ia) || (has_w && n.needs_grad(1)))) x = recompute_x();
    // The adapters' gradients are products in the activations' dtype, cast to the masters' (cuBLAS's
    // grouped call has no bf16 -> f32; PEFT's expert LoRA, a bf16 product of bf16-cast factors, rounds
    // its factors' gradients to bf16 alike): one grouped GEMM instead of one GEMM per expert.
    auto master_grad = [&](const Tensor& lhs, const Tensor& rhs, const Shape& shape, DType dtype) {
      Tensor o = Tensor::empty(shape, lhs.dtype(), lhs.device());
      ops::grouped_matmul_tn_into(lhs, rhs, o, offsets);
      return o.dtype() == dtype ? o : o.to(dtype);
    };
    if (n.needs_grad(ib)) db = master_grad(dy, keep_t, b_shape, b_dtype);  // db[e] = dy^T t
    if (has_w && n.needs_grad(1)) {  // full fine-tuning beside the adapter: dw[e] = dy^T x
      dw = Tensor::empty(w_shape, w_dtype, dy.device());
      ops::grouped_matmul_tn_into(dy, x, dw, offsets);
    }
    if (n.needs_grad(0) || n.needs_grad(ia)) {
      Tensor dt = Tensor::empty({rows, r}, dy.dtype(), dy.device());
      ops::grouped_matmul_into(dy, keep_b, dt, offsets, false, scale, 0.f);  // scale [n_e, out] x [out, r]
      if (n.needs_grad(ia)) da = master_grad(dt, x, a_shape, a_dtype);  // da[e] = dt^T x
      x = Tensor();  // one made again is let go before dx exists
      if (n.needs_grad(0)) {  // dx = dy w_e + dt a_e: [n_e, out] x [out, in] + [n_e, r] x [r, in]
        dx = Tensor::empty({rows, in}, dy.dtype(), dy.device());
        dual_product(op, keep_w, dy, dt, keep_a, dx, offsets, Pass::kBackward);
      }
    }
    return has_w ? Grads{dx, dw, da, db} : Grads{dx, da, db};
  };
  if (has_w) return record1(node_of(op, backward), {&xs, w_var, &a, &b}, y);
  return record1(node_of(op, backward), {&xs, &a, &b}, y);
}

}  // namespace

Variable grouped_linear(const Variable& xs, const Variable& w, const std::vector<int64_t>& offsets, OutputUse use,
                        const InputFn& recompute_x) {
  return grouped_linear_of(xs, &w, weight_of(w), offsets, use, recompute_x);
}

Variable grouped_linear(const Variable& xs, const ExpertWeightFn& w, const std::vector<int64_t>& offsets,
                        OutputUse use, const InputFn& recompute_x) {
  return grouped_linear_of(xs, nullptr, weight_of(w), offsets, use, recompute_x);
}

Variable grouped_linear_lora(const Variable& xs, const Variable& w, const Variable& a, const Variable& b, float scale,
                             const std::vector<int64_t>& offsets, OutputUse use, const InputFn& recompute_x) {
  return grouped_linear_lora_of(xs, &w, weight_of(w), a, b, scale, offsets, use, recompute_x);
}

Variable grouped_linear_lora(const Variable& xs, const ExpertWeightFn& w, const Variable& a, const Variable& b,
                             float scale, const std::vector<int64_t>& offsets, OutputUse use,
                             const InputFn& recompute_x) {
  return grouped_linear_lora_of(xs, nullptr, weight_of(w), a, b, scale, offsets, use, recompute_x);
}

}  // namespace loom::ag
