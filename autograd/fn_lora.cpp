// The LoRA linear as one differentiable function: y = x W^T (+ bias) + scale * (dropout(x) A^T) B^T
// with every product a GEMM in the compute dtype (x's) accumulating in f32, and B's product added
// into the base output by the GEMM itself (beta = 1): no cast or extra pass over the activations.
// In bf16 the adapter's small operands (A, B, A x, dy B) enter the GEMMs as hi + lo bf16 pairs
// (kernels/bf16_split.h), so the adapter keeps PEFT's f32 arithmetic to about 16 bits while the
// large operands (x, dy) stay the bf16 tensors they are.
//
// Order of the two products into one output (y, and dx in backward), bf16 without bias: the
// adapter's skinny product first, written (beta 0), then the base GEMM adds onto it (beta 1). The
// skinny product is memory-bound: written alone it moves the output once, where adding it after
// the base moved it twice (read and write), and the base GEMM, compute-bound, reads the output in
// its epilogue. The result is rounded to bf16 once where PEFT rounds twice (base, then base +
// adapter). H200, `bench/e2e/run.sh 1b` without checkpointing (bench/results/2026-12-02-h200-session19.md):
// 80,621 tok/s adapter first, 78,042 in PEFT's order (base, then the adapter added). PEFT's order
// stays for f32 and f64 and for a layer with a bias (added to the base output, as PEFT adds to it).
// With a residual (the MLP's last add: lora_linear's residual), the first GEMM reads it as its C: the
// adapter's product is rounded onto the residual, at its magnitude, and the base product added onto
// that; the add apart rounded the product first and the sum after.
//
// Where the caller left spare columns after x's rows (LoraArgs::x_spare: the norm before q/k/v and
// gate/up writes its output that way, models/block.cpp), the two products become one: t's bf16
// parts go into the spare columns and y = [x, t_hlh] [W, scale b_hhl]^T is a single GEMM with K =
// in + 3r, y written once and rounded once (a bias rides along as a column of ones in x and the
// bias as a column of the weight: rounded once too, where PEFT rounds base + bias, then adds the
// adapter). W's storage has the spare columns too (LoraArgs::w_spare, Linear::widen): s b_hhl is
// written there per call, [out, 3r], W itself never copied. It costs 3r (+ 1) more columns of K,
// and saves writing y and reading it back in the base GEMM's epilogue: 2 of 3 passes over
// [tokens, out], most for gate and up (out = intermediate size).
//
// Backward's dx mirrors it the other way: dy W + s dt A = dy (W + s B A), since dt = dy B. Where the
// projection's output is narrower than the tokens (lora_split.h's merge_for_dx: o and down, and q/k/v
// together, in the Llama shapes at 8 x 2048), W + s B A is made in bf16 (GEMM C = W read, D written
// apart, [out, in] once) and dx is one GEMM that writes dx once, in place of the skinny s dt A product
// writing [tokens, in] and the base GEMM reading it back in its epilogue. dt is then made only for dA.
#include "autograd/functions.h"
#include "autograd/lambda_node.h"
#include "autograd/lora_split.h"
#include "engine/ops_lora.h"

namespace loom::ag {
using detail::Grads;
using detail::node_of;

namespace detail {

// An adapter's dA or dB, allocated in the long-lived pool: autograd's accumulate_grad keeps it as the
// leaf's gradient as it is, not copied.
static Tensor adapter_grad_storage(const Shape& shape, DType dtype, Device device) {
  const LongLivedPoolScope gradient;
  return Tensor::empty(shape, dtype, device);
}

Tensor split_rows(const Tensor& m, const std::string& pattern) {
  const int64_t rows = m.size(0), cols = m.size(1);
  return ops::bf16_split(m.to(DType::f32).reshape({1, rows * cols}), pattern)
      .view({static_cast<int64_t>(pattern.size()) * rows, cols});
}
Tensor grad_so_far(Node& n, int64_t in) {
  const Tensor g = n.take_grad_so_far(0);
  return g.defined() ? g.view({-1, in}) : g;
}
Tensor sum_row_parts(const Tensor& m, int parts, float alpha) {
  const int64_t rows = m.size(0) / parts, cols = m.size(1);
  const LongLivedPoolScope gradient;  // dA: the leaf's gradient as it is (autograd's accumulate_grad)
  return ops::block_sum(m.reshape({1, m.numel()}), parts, alpha).view({rows, cols});
}

// dB = scale * dy^T t: [out, n] x [n, 2r] in f32, the two blocks summed, in B's dtype.
static Tensor split_b_grad(const Tensor& dy, const Tensor& t_parts, float scale, DType b_dtype) {
  const Tensor parts = ops::matmul(dy, t_parts, true, false, DType::f32);
  const LongLivedPoolScope gradient;  // dB: the leaf's gradient as it is
  return ops::block_sum(parts, 2, scale).to(b_dtype);
}

DyGrads split_dy_grads(const Tensor& dy, const Tensor& t_parts, const Tensor& b_parts, float scale, DType b_dtype,
                       bool want_db, const std::vector<std::string>& patterns, Tensor* into_a, Tensor* into_b) {
  DyGrads g;
  if (want_db && !patterns.empty()) {
    ops::LoraDyProducts p = ops::lora_dy_products(dy, b_parts, t_parts, 2, scale);
    g.db = p.db.to(b_dtype);
    g.dt_parts = ops::block_sum_split(p.dt, p.dt_blocks, 1.f, patterns, into_a, into_b);
    return g;
  }
  if (want_db) g.db = split_b_grad(dy, t_parts, scale, b_dtype);
  if (!patterns.empty())
    g.dt_parts = ops::block_sum_split(ops::matmul(dy, b_parts, false, false, DType::f32), 2, 1.f, patterns, into_a, into_b);
  return g;
}

OneGemm one_gemm_operands(const Tensor& x2, const Tensor& w, int64_t r, bool bias, const LoraArgs& lora, OutputUse use) {
  const int64_t ext = 3 * r + (bias ? 1 : 0);
  OneGemm one;
  if (use != OutputUse::kRead || lora.dropout > 0.f || lora.x_spare < ext || lora.w_spare < ext) return one;
  one.x_ext = ops::widen_rows(x2, ext);
  if (one.x_ext.defined()) one.w_ext = ops::widen_rows(w, ext);
  if (!one.w_ext.defined()) one.x_ext = Tensor();
  one.in = w.size(1);
  return one;
}

Tensor add_b_splits(std::vector<ops::SplitJob>& jobs, const Tensor& b, const OneGemm& one, float scale) {
  const int64_t out = b.size(0), r = b.size(1);
  const Tensor b32 = b.to(DType::f32);
  // [B_hi, B_hi, B_lo, B_hi]: the first 3r for y's product; [B_hi, B_lo] (dt's) and [B_hi, B_lo, B_hi]
  // (merged_weight's) after the first r, for backward.
  Tensor parts = Tensor::empty({out, 4 * r}, DType::bf16, b.device());
  jobs.push_back(ops::SplitJob{b32, 1, 1.f, "hhlh", parts, "", Tensor()});
  // s B's parts beside W in its spare columns, after its own: B changed since the last step.
  if (one.defined()) jobs.push_back(ops::SplitJob{b32, 1, scale, "hhl", one.w_ext.narrow(1, one.in, 3 * r), "", Tensor()});
  return parts;
}

void add_a_splits(std::vector<ops::SplitJob>& jobs, const Tensor& a, const Tensor& a_hhl, const Tensor* a_hl) {
  const int64_t cells = a.numel();  // the rows stacked: each part is all of A, flattened
  jobs.push_back(ops::SplitJob{a.to(DType::f32).reshape({1, cells}), 1, 1.f, "hhl", a_hhl.view({1, 3 * cells}),
                               a_hl ? "hl" : "", a_hl ? a_hl->view({1, 2 * cells}) : Tensor()});
}

SplitProduct split_product(const Tensor& x2, const Tensor& t32, const Tensor& w, const Tensor& b_parts,
                           const OneGemm& one, const Tensor* bias, const LoraArgs& lora, OutputUse use,
                           const Tensor* residual) {
  const int64_t in = w.size(1), out = w.size(0), r = b_parts.size(1) / 4, n = x2.size(0);
  const DType cdt = x2.dtype();
  const bool read = use == OutputUse::kRead;  // else only t (backward's) is computed, not y
  SplitProduct p;
  if (!read) {
    p.y = unread_value({n, out}, cdt, x2.device());
  } else if (bias && !one.defined()) {
    p.y = ops::add_bias(ops::matmul(x2, w, false, true), *bias);  // the base layer's output, rounded, as PEFT adds to it
  }
  // t = x (A_hi + A_lo)^T, blocks summed -> [n, r]: kept as its [t_hi, t_lo] parts for dB, and as
  // [t_hi, t_lo, t_hi] for the product below (with the one GEMM, straight into x's spare columns).
  Tensor x_tail = one.defined() ? one.x_ext.narrow(1, in, 3 * r) : Tensor();
  const std::vector<Tensor> t_parts = ops::block_sum_split(t32, 2, 1.f, {"hlh", "hl"}, one.defined() ? &x_tail : nullptr);
  const Tensor b_hhl = b_parts.narrow(1, 0, 3 * r);
  if (one.defined()) {  // y = [x, t_hlh (, 1)] [W, s b_hhl (, bias)]^T: written once, where the two products
                        // below write it, read and write it again
    if (bias) {
      Tensor ones = one.x_ext.narrow(1, in + 3 * r, 1);
      ops::copy_rows_(ones, Tensor::full({n, 1}, 1.f, cdt, x2.device()));
      Tensor w_bias = one.w_ext.narrow(1, in + 3 * r, 1);
      ops::copy_rows_(w_bias, bias->to(cdt).reshape({out, 1}));
    }
    p.y = Tensor::empty({n, out}, cdt, x2.device());
    p.residual_added = residual != nullptr;  // (+ residual, read as the GEMM's C)
    ops::matmul_into(one.x_ext, one.w_ext, p.y, false, true, 1.f, residual ? 1.f : 0.f, residual);
  } else if (read) {
    // y (+)= scale * (t_hi B_hi + t_lo B_hi + t_hi B_lo): [n, 3r] x [out, 3r]^T, first (written) without a
    // bias, onto the residual where there is one.
    const bool first = !bias;
    if (first) p.y = Tensor::empty({n, out}, cdt, x2.device());
    p.residual_added = first && residual;
    ops::matmul_into(t_parts[0], b_hhl, p.y, false, true, lora.scale, first && !residual ? 0.f : 1.f,
                     first ? residual : nullptr);
    if (first) ops::matmul_into(x2, w, p.y, false, true, 1.f, 1.f);  // y += x W^T
  }
  p.t_keep = t_parts[1];                     // [n, 2r]
  p.b_keep = b_parts.narrow(1, r, 2 * r);    // [out, 2r], row stride 4r (GEMMs take it as it is)
  p.b_merge = b_parts.narrow(1, r, 3 * r);   // [out, 3r]
  return p;
}

Tensor merged_weight(const Tensor& w, const Tensor& b_merge, const Tensor& a_hhl, float scale) {
  const Tensor wr = w.dim() == 2 && w.strides()[1] == 1 && w.strides()[0] >= w.size(1) ? w : w.contiguous();
  const int64_t out = wr.size(0), in = wr.size(1), pitch = wr.strides()[0];
  Tensor merged = Tensor::empty({out, pitch}, wr.dtype(), wr.device());
  if (pitch != in) merged = merged.narrow(1, 0, in);
  ops::matmul_into(b_merge, a_hhl, merged, false, false, scale, 1.f, &wr);  // [out, 3r] x [3r, in] + W
  return merged;
}

}  // namespace detail

namespace {
using detail::grad_so_far;
using detail::sum_row_parts;

// dA = scale * dt^T x: [r, n] x [n, in], from dt's [dt_hi, dt_lo] parts (split, [n, 2r]) or dt [n, r].
Tensor adapter_a_grad(const Tensor& dt, const Tensor& x, bool split, float scale, int64_t r, DType a_dtype) {
  if (split) return sum_row_parts(ops::matmul(dt, x, true, false, DType::f32), 2, scale).to(a_dtype);
  Tensor da = detail::adapter_grad_storage({r, x.size(1)}, a_dtype, dt.device());
  ops::matmul_into(dt, x, da, true, false, scale, 0.f);
  return da;
}

// What lora_linear's backward leaves for the node that made its input (glu_lora_linear's activation)
// to finish dA with the input it makes again in its own pass: dt's parts (or dt) and how to use them.
struct DeferredA {
  Tensor dt;
  bool split = false;
  float scale = 1.f;
  int64_t r = 0;
  DType a_dtype = DType::f32;
};

Variable lora_linear_of(const Variable& x, const Variable& w, const Variable& a, const Variable& b,
                        const LoraArgs& lora, const Variable* bias, const WeightFn& rematerialize,
                        const InputFn& recompute_x, OutputUse use, std::shared_ptr<DeferredA> defer_a,
                        const Variable* residual);

}  // namespace

Variable lora_linear(const Variable& x, const Variable& w, const Variable& a, const Variable& b, const LoraArgs& lora,
                     const Variable* bias, const WeightFn& rematerialize, const InputFn& recompute_x,
                     OutputUse use, const Variable* residual) {
  return lora_linear_of(x, w, a, b, lora, bias, rematerialize, recompute_x, use, nullptr, residual);
}

Variable glu_lora_linear(const Variable& gate, const Variable& up, bool gelu, const Variable& w, const Variable& a,
                         const Variable& b, const LoraArgs& lora, const Variable* bias,
                         const WeightFn& rematerialize, OutputUse use, const Variable* residual) {
  LOOM_CHECK(lora.dropout <= 0.f && !w.requires_grad(), "glu_lora_linear: needs a frozen weight and no adapter ",
             "dropout (got dropout ", lora.dropout, w.requires_grad() ? ", a trained weight)" : ")");
  Tensor gv = gate.value(), uv = up.value();
  const Tensor hv = gelu ? ops::geglu(gv, uv) : ops::swiglu(gv, uv);
  auto defer = std::make_shared<DeferredA>();
  // The activation's node: gate's and up's gradients, act(gate) * up made again in the same pass
  // (over dh's buffer when the tape handed it over alone), and with it the adapter's dA that
  // lora_linear's backward, which ran just before, left here. It holds A as an input for that.
  // (With A frozen, h is not made again: the plain backward.)
  auto backward = [gv, uv, gelu, defer](Node& n, Grads& g) mutable {
    if (!n.needs_grad(2)) {
      auto [dgate, dup] = gelu ? ops::geglu_backward_consuming(std::move(gv), std::move(uv), g[0])
                               : ops::swiglu_backward_consuming(std::move(gv), std::move(uv), g[0]);
      return Grads{dgate, dup, Tensor()};
    }
    // lora_linear's backward ran first (it made this node's output gradient) and left dt here.
    LOOM_CHECK(defer->dt.defined(), "glu_lora_linear: the adapter's backward left no dt for dA");
    ops::GluGrads r = ops::glu_backward_with_value(std::move(gv), std::move(uv), std::move(g[0]), gelu);
    const Tensor da = adapter_a_grad(defer->dt, r.value.reshape({-1, r.value.size(-1)}), defer->split, defer->scale,
                                     defer->r, defer->a_dtype);
    defer->dt = Tensor();
    return Grads{r.dgate, r.dup, da};
  };
  const Variable h = record1(node_of(gelu ? "geglu" : "swiglu", backward), {&gate, &up, &a}, hv);
  return lora_linear_of(h, w, a, b, lora, bias, rematerialize, {}, use, defer, residual);
}

namespace {

// lora_linear; with defer_a, dA is left (as dt) for the node that made x to finish (glu_lora_linear);
// with residual, residual + the product (its gradient: the output's).
Variable lora_linear_of(const Variable& x, const Variable& w, const Variable& a, const Variable& b,
                        const LoraArgs& lora, const Variable* bias, const WeightFn& rematerialize,
                        const InputFn& recompute_x, OutputUse use, std::shared_ptr<DeferredA> defer_a,
                        const Variable* residual) {
  LOOM_CHECK(!rematerialize || !w.requires_grad(), "lora_linear: a re-materialised weight must be frozen");
  const Tensor& xv = x.value();
  LOOM_CHECK(w.value().dim() == 2 && a.value().dim() == 2 && b.value().dim() == 2 && xv.dim() >= 1, "lora_linear: ",
             "x ", xv.str(), ", weight ", w.value().str(), ", lora_A ", a.value().str(), ", lora_B ", b.value().str());
  const int64_t in = w.size(1), out = w.size(0), r = a.size(0);
  LOOM_CHECK(xv.size(-1) == in && a.size(1) == in && b.size(0) == out && b.size(1) == r, "lora_linear: x ", xv.str(),
             " weight ", w.value().str(), " lora_A ", a.value().str(), " lora_B ", b.value().str(),
             " do not chain as [.., in] x [out, in]^T + ([.., in] x [r, in]^T) x [out, r]^T");
  LOOM_CHECK(w.dtype() == xv.dtype(), "lora_linear: weight ", w.value().str(), " and x ", xv.str(), " differ in dtype");
  const DType cdt = xv.dtype();
  const bool split = cdt == DType::bf16;
  Shape out_shape = xv.shape();
  out_shape.back() = out;
  LOOM_CHECK(!residual || (residual->value().shape() == out_shape && residual->dtype() == cdt &&
                           residual->value().device() == xv.device()),
             "lora_linear: the residual ", residual ? residual->value().str() : "", " does not match the output of x ",
             xv.str(), " times W ", w.value().str());
  // The residual's rows (read by a GEMM as its C where they have the output's layout, else added after).
  const Tensor res2 = residual && use == OutputUse::kRead ? residual->value().reshape({-1, out}) : Tensor();
  const Tensor x2 = ops::rows_of(xv);  // a view also of a norm's output with spare columns
  const Tensor xd = lora.dropout > 0.f ? ops::dropout(x2, lora.dropout, lora.seed, lora.offset) : x2;
  const bool first = split && !bias;  // the adapter's product first: see the top of the file
  // What backward keeps: t (or its bf16 parts), B and A in the forms the GEMMs take.
  Tensor y, t_keep, b_keep, a_keep, b_merge;
  bool residual_added = false;
  if (split) {
    // The parameters' parts in one launch: [A_hi; A_hi; A_lo] for dx (its last 2r rows are [A_hi; A_lo]:
    // one split for both), B's, and with the one GEMM s B's beside W.
    const detail::OneGemm one = detail::one_gemm_operands(x2, w.value(), r, bias != nullptr, lora, use);
    const Tensor a_hhl = Tensor::empty({3 * r, in}, DType::bf16, xv.device());
    std::vector<ops::SplitJob> jobs;
    detail::add_a_splits(jobs, a.value(), a_hhl);
    const Tensor b_parts = detail::add_b_splits(jobs, b.value(), one, lora.scale);
    ops::block_sum_split_batch(jobs);
    // t = x (A_hi + A_lo)^T in f32: [n, in] x [2r, in]^T -> [n, 2r], its blocks summed in split_product.
    detail::SplitProduct p = detail::split_product(
        x2, ops::matmul(xd, a_hhl.narrow(0, r, 2 * r), false, true, DType::f32), w.value(), b_parts, one,
        bias ? &bias->value() : nullptr, lora, use, res2.defined() && res2.is_contiguous() ? &res2 : nullptr);
    residual_added = p.residual_added;
    y = std::move(p.y), t_keep = std::move(p.t_keep), b_keep = std::move(p.b_keep);
    if (x.requires_grad()) a_keep = a_hhl, b_merge = std::move(p.b_merge);  // [3r, in], [out, 3r]
  } else {
    if (use != OutputUse::kRead) {
      y = detail::unread_value({x2.size(0), out}, cdt, xv.device());
    } else {
      y = ops::matmul(x2, w.value(), false, true);    // [n, in] x [out, in]^T -> [n, out]
      if (bias) y = ops::add_bias(y, bias->value());  // the base layer's output, rounded, as PEFT adds to it
    }
    const Tensor ac = a.value().to(cdt);
    b_keep = b.value().to(cdt);
    t_keep = ops::matmul(xd, ac, false, true);  // [n, in] x [r, in]^T -> [n, r]
    if (use == OutputUse::kRead) ops::matmul_into(t_keep, b_keep, y, false, true, lora.scale, 1.f);  // y += scale * [n, r] x [out, r]^T
    if (x.requires_grad()) a_keep = ac;
  }
  if (res2.defined() && !residual_added) y = ops::add(res2, y);

  Tensor keep_w = x.requires_grad() && !rematerialize ? w.value() : Tensor();
  Tensor keep_x = recompute_x || defer_a ? Tensor() : x2;  // (defer_a: W frozen, dA made by x's maker)
  const DType a_dtype = a.dtype(), b_dtype = b.dtype(), bias_dtype = bias ? bias->dtype() : DType::f32;
  auto backward = [keep_x, recompute_x, keep_w, rematerialize, a_keep, b_keep, b_merge, t_keep, lora, split, first,
                   r, in, a_dtype, b_dtype, bias_dtype, defer_a, xshape = xv.shape()](Node& n, const Grads& g) {
    const Tensor dy = g[0].reshape({-1, g[0].size(-1)});  // [n, out]
    const float scale = lora.scale;
    // dx = dy (W + s B A) where that moves fewer bytes (lora_split.h): no dt parts for dx then.
    const bool merged_dx = n.needs_grad(0) && split && lora.dropout <= 0.f &&
                           detail::merge_for_dx(dy.size(0), dy.size(1));
    Tensor dx, dw, da, db, dbias;
    Tensor x2 = keep_x;
    auto input = [&] {  // x [n, in], computed again at most once when it was not kept
      if (!x2.defined()) x2 = recompute_x().reshape({-1, in});
      return x2;
    };
    auto dropped = [&] {
      return lora.dropout > 0.f ? ops::dropout(input(), lora.dropout, lora.seed, lora.offset) : input();
    };
    // dB = scale * dy^T t: [out, n] x [n, r]; dt = dy B (scale applied below): [n, out] x [out, r].
    // In bf16 both from [.., 2r] parts, summed in f32 (one pass over dy for both), dt split at once into
    // the parts dA ([dt_hi, dt_lo]) and dx ([dt_hi, dt_lo, dt_hi]) take.
    Tensor dt, dt_hl, dt_hlh;
    if (split) {
      std::vector<std::string> patterns;
      if (n.needs_grad(2)) patterns.push_back("hl");
      if (n.needs_grad(0) && !merged_dx) patterns.push_back("hlh");
      detail::DyGrads d = detail::split_dy_grads(dy, t_keep, b_keep, scale, b_dtype, n.needs_grad(3), patterns);
      db = std::move(d.db);
      if (n.needs_grad(2)) dt_hl = d.dt_parts[0];
      if (n.needs_grad(0) && !merged_dx) dt_hlh = d.dt_parts.back();
    } else {
      if (n.needs_grad(3)) {
        db = detail::adapter_grad_storage({dy.size(1), r}, b_dtype, dy.device());
        ops::matmul_into(dy, t_keep, db, true, false, scale, 0.f);
      }
      if (n.needs_grad(0) || n.needs_grad(2)) dt = ops::matmul(dy, b_keep);
    }
    if (n.needs_grad(0) || n.needs_grad(2)) {
      if (n.needs_grad(2) && defer_a) {  // dA is finished where x is made again (glu_lora_linear)
        *defer_a = DeferredA{split ? dt_hl : dt, split, scale, r, a_dtype};
      } else if (n.needs_grad(2)) {  // dA = scale * dt^T dropout(x): [r, n] x [n, in]
        da = adapter_a_grad(split ? dt_hl : dt, dropped(), split, scale, r, a_dtype);
        // A recomputed input is not needed again unless W trains: it goes before dx, the size of
        // x, is allocated (down_proj: [tokens, intermediate] less at the layer's backward peak).
        if (recompute_x && !n.needs_grad(1)) x2 = Tensor();
      }
      if (merged_dx || (n.needs_grad(0) && first && lora.dropout <= 0.f)) {  // into x's gradient so far
        const Tensor so_far = grad_so_far(n, in);
        dx = so_far.defined() ? so_far : Tensor::empty({dy.size(0), in}, dy.dtype(), dy.device());
        const float beta = so_far.defined() ? 1.f : 0.f;
        if (merged_dx) {  // dx (+)= dy (W + scale * B A)
          const Tensor merged = detail::merged_weight(rematerialize ? rematerialize() : keep_w, b_merge, a_keep, scale);
          ops::matmul_into(dy, merged, dx, false, false, 1.f, beta);
        } else {  // dx (+)= scale * dt A, then += dy W
          ops::matmul_into(dt_hlh, a_keep, dx, false, false, scale, beta);
          ops::matmul_into(dy, rematerialize ? rematerialize() : keep_w, dx, false, false, 1.f, 1.f);
        }
        dx = dx.view(xshape);
      } else if (n.needs_grad(0)) {  // dx (+)= dy W + dropout'(scale * dt A)
        const Tensor so_far = lora.dropout > 0.f ? Tensor() : grad_so_far(n, in);
        const Tensor wt = rematerialize ? rematerialize() : keep_w;
        if (so_far.defined()) {
          dx = so_far;
          ops::matmul_into(dy, wt, dx, false, false, 1.f, 1.f);
        } else {
          dx = ops::matmul(dy, wt);  // [n, out] x [out, in]
        }
        const Tensor dt_parts = split ? dt_hlh : dt;  // pairs with a_keep's [A_hi; A_hi; A_lo]
        if (lora.dropout > 0.f) {
          dx = ops::add(dx, ops::scale(ops::dropout(ops::matmul(dt_parts, a_keep), lora.dropout, lora.seed, lora.offset),
                                       scale));
        } else {
          ops::matmul_into(dt_parts, a_keep, dx, false, false, scale, 1.f);  // dx += scale * [n, r] x [r, in]
        }
        dx = dx.view(xshape);
      }
    }
    if (n.needs_grad(1)) dw = ops::matmul(dy, input(), true, false);  // full fine-tuning with an adapter: [out, in]
    if (n.needs_grad(4)) dbias = ops::sum_rows(dy, bias_dtype);
    return Grads{dx, dw, da, db, dbias, n.needs_grad(5) ? g[0] : Tensor()};
  };
  return record1(node_of("lora_linear", backward), {&x, &w, &a, &b, bias, residual}, y.view(out_shape));
}

}  // namespace

Variable frozen_linear(const Variable& x, const Variable& w, const WeightFn& rematerialize, const Variable* bias,
                       OutputUse use) {
  LOOM_CHECK(!w.requires_grad(), "frozen_linear: the weight must be frozen, got one that requires grad");
  const Tensor& xv = x.value();
  LOOM_CHECK(w.value().dim() == 2 && xv.size(-1) == w.size(1), "frozen_linear: x ", xv.str(), " and weight ",
             w.value().str(), " do not match as [.., in] x [out, in]^T");
  Shape out_shape = xv.shape();
  out_shape.back() = w.size(0);
  Tensor y;
  if (use == OutputUse::kRead) {
    y = ops::matmul(xv.reshape({-1, w.size(1)}), w.value(), false, true);
    if (bias) y = ops::add_bias(y, bias->value());
  } else {
    y = detail::unread_value({xv.numel() / w.size(1), w.size(0)}, xv.dtype(), xv.device());
  }
  Tensor keep_w = x.requires_grad() && !rematerialize ? w.value() : Tensor();
  const DType bias_dtype = bias ? bias->dtype() : DType::f32;
  auto backward = [keep_w, rematerialize, bias_dtype, xshape = xv.shape()](Node& n, const Grads& g) {
    const Tensor dy = g[0].reshape({-1, g[0].size(-1)});
    Tensor dx, dbias;
    if (n.needs_grad(0)) {  // dx (+)= dy W
      const Tensor wt = rematerialize ? rematerialize() : keep_w;
      const Tensor so_far = grad_so_far(n, wt.size(1));
      if (so_far.defined()) {
        dx = so_far;
        ops::matmul_into(dy, wt, dx, false, false, 1.f, 1.f);
      } else {
        dx = ops::matmul(dy, wt);
      }
      dx = dx.view(xshape);
    }
    if (n.needs_grad(2)) dbias = ops::sum_rows(dy, bias_dtype);
    return Grads{dx, Tensor(), dbias};
  };
  return record1(node_of("frozen_linear", backward), {&x, &w, bias}, y.view(out_shape));
}

}  // namespace loom::ag
