// LoRA projections that read one input (q, k, v; gate, up) as one differentiable function: each
// output is what lora_linear gives (autograd/fn_lora.cpp: the same products, order and bf16 hi + lo
// split), but the adapters' products that read or write the shared side run once for all of them:
//   forward  t = x [A_0; A_1; ..]^T            one pass over x instead of one a projection
//   backward dA = [dt_0, dt_1, ..]^T x           one pass over x
//            dx (+)= [dt_0, dt_1, ..] [A_0; ..]  one pass over dx (K = the ranks together) where each
//                                                projection's would read and write it
// The base products (x W_i^T, dy_i W_i) stay one GEMM each. Each t_i, dt_i is a block of columns of
// one [tokens, G x parts x r] matrix: per projection, its skinny products read and write that block in
// place (a row-strided GEMM operand or output), and one block_sum_split serves them all.
#include "autograd/functions.h"
#include "autograd/lambda_node.h"
#include "autograd/lora_split.h"

namespace loom::ag {
using detail::Grads;
using detail::node_of;
using detail::split_rows;

namespace {

// The blocks stacked along the rows: [sum of rows, cols].
Tensor stack_rows(const std::vector<Tensor>& blocks) {
  int64_t rows = 0;
  for (const Tensor& b : blocks) rows += b.size(0);
  Tensor out = Tensor::empty({rows, blocks.front().size(1)}, blocks.front().dtype(), blocks.front().device());
  int64_t at = 0;
  for (const Tensor& b : blocks) {
    out.narrow(0, at, b.size(0)).copy_(b);
    at += b.size(0);
  }
  return out;
}

}  // namespace

const char* lora_shared_unsupported(const Variable& x, const std::vector<LoraMember>& members, float dropout) {
  if (members.size() < 2) return "fewer than two projections";
  if (dropout > 0.f) return "adapter dropout (a mask of its own a projection)";
  const int64_t in = x.value().size(-1), r = members.front().a->size(0);
  for (const LoraMember& m : members) {
    if (m.w->requires_grad()) return "a trained base weight";
    if (m.w->dtype() != x.dtype()) return "a base weight in another dtype than x";
    if (m.w->value().dim() != 2 || m.w->size(1) != in || m.a->value().dim() != 2 || m.a->size(1) != in)
      return "a weight or lora_A that does not take x";
    if (m.a->size(0) != r || m.b->value().dim() != 2 || m.b->size(1) != r || m.b->size(0) != m.w->size(0))
      return "ranks or lora_B shapes that differ";
  }
  return nullptr;
}

std::vector<Variable> lora_linear_shared(const Variable& x, const std::vector<LoraMember>& members, float scale) {
  const char* why = lora_shared_unsupported(x, members, 0.f);
  LOOM_CHECK(why == nullptr, "lora_linear_shared: ", why, " (x ", x.value().str(), ")");
  const Tensor& xv = x.value();
  const int64_t g_count = static_cast<int64_t>(members.size()), in = xv.size(-1), r = members.front().a->size(0);
  const DType cdt = xv.dtype();
  const bool split = cdt == DType::bf16;
  const Tensor x2 = xv.reshape({-1, in});
  const int64_t n = x2.size(0);

  // Forward. t_keep: [n, G x 2r] (split: each projection's [t_hi, t_lo]) or [n, G x r]; b_keep[i] as
  // fn_lora.cpp keeps B; a_keep: the A side of dx, [G x 3r, in] ([A_hi; A_hi; A_lo] a projection) or
  // [G x r, in].
  std::vector<Tensor> ys(members.size()), b_keep(members.size());
  Tensor t_keep, a_keep;
  if (split) {
    std::vector<Tensor> a_hhl, a_hl;
    for (const LoraMember& m : members) {
      a_hhl.push_back(split_rows(m.a->value(), "hhl"));
      a_hl.push_back(a_hhl.back().narrow(0, r, 2 * r));
    }
    // [n, G x 2r] in f32: each projection's x A_hi^T, x A_lo^T; as [n x G, 2r] its blocks summed and
    // split at once: [n, G x 3r] ([t_hi, t_lo, t_hi] a projection) and [n, G x 2r] ([t_hi, t_lo]).
    const Tensor t2 = ops::matmul(x2, stack_rows(a_hl), false, true, DType::f32);
    const std::vector<Tensor> parts = ops::block_sum_split(t2.view({n * g_count, 2 * r}), 2, 1.f, {"hlh", "hl"});
    const Tensor t_hlh = parts[0].view({n, g_count * 3 * r});
    t_keep = parts[1].view({n, g_count * 2 * r});
    for (size_t i = 0; i < members.size(); ++i) {
      const LoraMember& m = members[i];
      const Tensor b_hhl = ops::bf16_split(m.b->value().to(DType::f32), "hhl");  // [out, 3r]
      ys[i] = Tensor::empty({n, m.w->size(0)}, cdt, xv.device());
      // The adapter's product first, then the base GEMM adds onto it (fn_lora.cpp's order for bf16).
      ops::matmul_into(t_hlh.narrow(1, int64_t(i) * 3 * r, 3 * r), b_hhl, ys[i], false, true, scale, 0.f);
      ops::matmul_into(x2, m.w->value(), ys[i], false, true, 1.f, 1.f);
      b_keep[i] = b_hhl.narrow(1, r, 2 * r);
    }
    if (x.requires_grad()) a_keep = stack_rows(a_hhl);
  } else {
    std::vector<Tensor> as;
    for (const LoraMember& m : members) as.push_back(m.a->value().to(cdt));
    const Tensor a_cat = stack_rows(as);                // [G x r, in]
    t_keep = ops::matmul(x2, a_cat, false, true);        // [n, G x r]
    for (size_t i = 0; i < members.size(); ++i) {
      const LoraMember& m = members[i];
      b_keep[i] = m.b->value().to(cdt);
      ys[i] = ops::matmul(x2, m.w->value(), false, true);  // PEFT's order: the base, then the adapter added
      ops::matmul_into(t_keep.narrow(1, int64_t(i) * r, r), b_keep[i], ys[i], false, true, scale, 1.f);
    }
    if (x.requires_grad()) a_keep = a_cat;
  }

  std::vector<Tensor> keep_w(members.size());
  std::vector<WeightFn> remat(members.size());
  std::vector<DType> a_dtypes, b_dtypes;
  for (size_t i = 0; i < members.size(); ++i) {
    remat[i] = members[i].rematerialize;
    if (x.requires_grad() && !remat[i]) keep_w[i] = members[i].w->value();
    a_dtypes.push_back(members[i].a->dtype());
    b_dtypes.push_back(members[i].b->dtype());
  }
  auto backward = [x2, keep_w, remat, a_keep, b_keep, t_keep, split, scale, r, in, n, g_count, a_dtypes, b_dtypes,
                   xshape = xv.shape()](Node& node, const Grads& g) {
    const size_t count = size_t(g_count);
    auto a_at = [](size_t i) { return 2 + 3 * i; };
    auto b_at = [](size_t i) { return 3 + 3 * i; };
    bool any_a = false;
    for (size_t i = 0; i < count; ++i) any_a = any_a || node.needs_grad(a_at(i));
    const int64_t width = split ? 2 * r : r;  // a projection's columns of t_keep and of dt
    Grads out(1 + 3 * count);
    std::vector<Tensor> dys(count);
    for (size_t i = 0; i < count; ++i) {
      const int64_t o = b_keep[i].size(0);
      // An output nothing read back-propagates zeros.
      dys[i] = g[i].defined() ? g[i].reshape({-1, o}) : Tensor::zeros({n, o}, x2.dtype(), x2.device());
      if (node.needs_grad(b_at(i))) {  // dB = scale dy^T t (blocks summed in f32)
        const Tensor t_i = t_keep.narrow(1, int64_t(i) * width, width);
        if (split) {
          out[b_at(i)] = ops::block_sum(ops::matmul(dys[i], t_i, true, false, DType::f32), 2, scale).to(b_dtypes[i]);
        } else {
          out[b_at(i)] = Tensor::empty({o, r}, b_dtypes[i], dys[i].device());
          ops::matmul_into(dys[i], t_i, out[b_at(i)], true, false, scale, 0.f);
        }
      }
    }
    if (!node.needs_grad(0) && !any_a) return out;
    // dt = dy_i B_i, each into its block of one [n, G x width] matrix.
    Tensor dt = Tensor::empty({n, g_count * width}, split ? DType::f32 : x2.dtype(), x2.device());
    for (size_t i = 0; i < count; ++i) {
      Tensor block = dt.narrow(1, int64_t(i) * width, width);
      ops::matmul_into(dys[i], b_keep[i], block, false, false, 1.f, 0.f);
    }
    Tensor dt_hl = dt, dt_hlh = dt;  // without the split: dt as it is for both
    if (split) {
      std::vector<std::string> patterns;
      if (any_a) patterns.push_back("hl");
      if (node.needs_grad(0)) patterns.push_back("hlh");
      const std::vector<Tensor> parts = ops::block_sum_split(dt.view({n * g_count, 2 * r}), 2, 1.f, patterns);
      if (any_a) dt_hl = parts[0].view({n, g_count * 2 * r});
      if (node.needs_grad(0)) dt_hlh = parts.back().view({n, g_count * 3 * r});
    }
    if (any_a) {  // dA = scale dt^T x for all at once: [G x width, in], then each projection's rows
      const Tensor da = ops::matmul(dt_hl, x2, true, false, x2.dtype() == DType::f64 ? DType::f64 : DType::f32);
      for (size_t i = 0; i < count; ++i) {
        if (!node.needs_grad(a_at(i))) continue;
        const Tensor rows = da.narrow(0, int64_t(i) * width, width);
        out[a_at(i)] = split ? ops::block_sum(rows.reshape({1, rows.numel()}), 2, scale).view({r, in}).to(a_dtypes[i])
                             : ops::scale(rows, scale).to(a_dtypes[i]);
      }
    }
    if (node.needs_grad(0)) {  // dx (+)= scale dt A (one GEMM over every rank), then += dy_i W_i
      const Tensor so_far = node.take_grad_so_far(0);
      Tensor dx = so_far.defined() ? so_far.view({-1, in}) : Tensor::empty({n, in}, x2.dtype(), x2.device());
      if (split) {
        ops::matmul_into(dt_hlh, a_keep, dx, false, false, scale, so_far.defined() ? 1.f : 0.f);
        for (size_t i = 0; i < count; ++i)
          ops::matmul_into(dys[i], remat[i] ? remat[i]() : keep_w[i], dx, false, false, 1.f, 1.f);
      } else {  // PEFT's order: the base products first
        for (size_t i = 0; i < count; ++i)
          ops::matmul_into(dys[i], remat[i] ? remat[i]() : keep_w[i], dx, false, false, 1.f,
                           i == 0 && !so_far.defined() ? 0.f : 1.f);
        ops::matmul_into(dt_hlh, a_keep, dx, false, false, scale, 1.f);
      }
      out[0] = dx.view(xshape);
    }
    return out;
  };

  std::vector<const Variable*> inputs{&x};
  for (const LoraMember& m : members) inputs.insert(inputs.end(), {m.w, m.a, m.b});
  for (size_t i = 0; i < members.size(); ++i) {
    Shape s = xv.shape();
    s.back() = members[i].w->size(0);
    ys[i] = ys[i].view(s);
  }
  return record(node_of("lora_linear_shared", backward), inputs, ys);
}

}  // namespace loom::ag
