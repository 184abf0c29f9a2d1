// ag::lora_linears: the bf16 LoRA products of several projections that read one x (q, k and v; gate
// and up), with their adapters' passes over x and over dx shared. Per product (fn_lora.cpp) x is
// read three times for its adapter (t = x A^T in forward, dA = dt^T x in backward) and dx read and
// written once more for its scale * dt A term; here every adapter's A is stacked into one matrix so
// that each of those passes happens once for all of them:
//   forward   T = x [A1_hl; A2_hl; ...]^T       one GEMM, [n, sum 2r] f32; each product's block
//             then gives its t parts (pitched reads: no copy) and its y as lora_linear makes it
//   backward  dB_i, dt_i from each dy_i         as lora_linear (dt_i's parts written side by side)
//             [dA_1; dA_2; ...] = DT_hl^T x     one GEMM, [sum 2r, in] f32, each block summed
//             dx (+)= s DT_hlh [A1_hhl; A2_hhl; ...], then += dy_i W_i for each i (beta 1); or, where
//             the outputs together are fewer than the tokens, dx (+)= dy_i (W_i + s B_i A_i) for each i
//             (detail::merge_for_dx: no DT_hlh, no skinny product over dx)
#include "autograd/functions.h"
#include "autograd/lambda_node.h"
#include "autograd/lora_split.h"

namespace loom::ag {
using detail::Grads;
using detail::node_of;

std::vector<Variable> lora_linears(const Variable& x, const std::vector<LoraProduct>& products) {
  const char* op = "lora_linears";
  const Tensor& xv = x.value();
  LOOM_CHECK(!products.empty(), op, ": no products");
  LOOM_CHECK(xv.dtype() == DType::bf16 && xv.dim() >= 1, op, ": needs x in bf16, got ", xv.str());
  const int64_t in = xv.size(-1);
  const float scale = products.front().lora.scale;
  // Each adapter's offset in the stacked A (in rows of r) and its rank.
  std::vector<int64_t> off, rank;
  int64_t total = 0;
  for (const LoraProduct& p : products) {
    LOOM_CHECK(p.a && p.b && (p.weight.defined() || p.make_weight), op, ": a product without its adapter or weight");
    const Tensor& a = p.a->value();
    const Tensor& b = p.b->value();
    LOOM_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == in && b.size(1) == a.size(0), op, ": x ", xv.str(),
               " lora_A ", a.str(), " lora_B ", b.str(), " do not chain as [.., in] x [r, in]^T x [out, r]^T");
    LOOM_CHECK(p.lora.dropout <= 0.f && p.lora.scale == scale, op, ": needs no dropout and one scale (got dropout ",
               p.lora.dropout, ", scale ", p.lora.scale, " against ", scale, ")");
    LOOM_CHECK(!p.weight.defined() || (p.weight.dim() == 2 && p.weight.size(1) == in && p.weight.size(0) == b.size(0) &&
                                       p.weight.dtype() == DType::bf16),
               op, ": weight ", p.weight.str(), " for x ", xv.str(), " and lora_B ", b.str());
    off.push_back(total), rank.push_back(a.size(0));
    total += a.size(0);
  }
  const Tensor x2 = ops::rows_of(xv);  // a view also of a norm's output with spare columns
  const int64_t n = x2.size(0);
  // [A_hi; A_hi; A_lo] of each adapter, stacked ([3 total, in]: dx's operand), and [A_hi; A_lo] of each
  // ([2 total, in]: t's), B's parts and (with the one GEMM) s B's beside W: every adapter's parameter
  // splits in one launch.
  Tensor a_hhl = Tensor::empty({3 * total, in}, DType::bf16, xv.device());
  Tensor a_hl = Tensor::empty({2 * total, in}, DType::bf16, xv.device());
  std::vector<ops::SplitJob> jobs;
  std::vector<Tensor> b_parts;
  std::vector<detail::OneGemm> ones;
  for (size_t i = 0; i < products.size(); ++i) {
    const LoraProduct& p = products[i];
    const Tensor hl = a_hl.narrow(0, 2 * off[i], 2 * rank[i]);
    detail::add_a_splits(jobs, p.a->value(), a_hhl.narrow(0, 3 * off[i], 3 * rank[i]), &hl);
    // A weight made on demand (dequantised) has no spare columns: it is made below, when its product runs.
    ones.push_back(p.weight.defined() ? detail::one_gemm_operands(x2, p.weight, rank[i], p.bias != nullptr, p.lora,
                                                                  OutputUse::kRead)
                                      : detail::OneGemm{});
    b_parts.push_back(detail::add_b_splits(jobs, p.b->value(), ones.back(), p.lora.scale));
  }
  ops::block_sum_split_batch(jobs);
  const Tensor t32 = ops::matmul(x2, a_hl, false, true, DType::f32);  // [n, 2 total]: x read once
  std::vector<Tensor> ys, t_keep, b_keep, b_merge;
  for (size_t i = 0; i < products.size(); ++i) {
    const LoraProduct& p = products[i];
    const Tensor w = p.weight.defined() ? p.weight : p.make_weight();
    detail::SplitProduct s =
        detail::split_product(x2, t32.narrow(1, 2 * off[i], 2 * rank[i]), w, b_parts[i], ones[i],
                              p.bias ? &p.bias->value() : nullptr, p.lora, OutputUse::kRead);
    Shape shape = xv.shape();
    shape.back() = w.size(0);
    ys.push_back(s.y.view(shape));
    t_keep.push_back(std::move(s.t_keep)), b_keep.push_back(std::move(s.b_keep));
    b_merge.push_back(x.requires_grad() ? std::move(s.b_merge) : Tensor());
  }

  struct Kept {
    Tensor weight;
    WeightFn make_weight;
    DType a_dtype, b_dtype, bias_dtype;
  };
  std::vector<Kept> kept;
  std::vector<const Variable*> inputs{&x};
  for (const LoraProduct& p : products) {
    kept.push_back({x.requires_grad() ? p.weight : Tensor(), p.make_weight, p.a->dtype(), p.b->dtype(),
                    p.bias ? p.bias->dtype() : DType::f32});
    inputs.insert(inputs.end(), {p.a, p.b, p.bias});
  }
  const Tensor keep_a_hhl = x.requires_grad() ? a_hhl : Tensor();
  auto backward = [x2, keep_a_hhl, t_keep, b_keep, b_merge, kept, off, rank, total, scale, n, in,
                   xshape = xv.shape()](Node& node, const Grads& g) {
    const size_t m = kept.size();
    auto grad_index = [](size_t i, int which) { return 1 + 3 * i + which; };  // which: 0 A, 1 B, 2 bias
    bool any_a = false;
    for (size_t i = 0; i < m; ++i) any_a = any_a || node.needs_grad(grad_index(i, 0));
    const bool want_dx = node.needs_grad(0);
    Grads out(1 + 3 * m);
    // dt's parts of every adapter side by side: [dt_hi, dt_lo] for dA, [dt_hi, dt_lo, dt_hi] for dx.
    // An output without a gradient leaves its columns zero (its adapter adds nothing).
    bool all = true;
    for (size_t i = 0; i < m; ++i) all = all && g[i].defined();
    auto parts = [&](int64_t cols) {
      return all ? Tensor::empty({n, cols}, DType::bf16, x2.device()) : Tensor::zeros({n, cols}, DType::bf16, x2.device());
    };
    int64_t outs = 0;  // the outputs with a gradient, together
    for (size_t i = 0; i < m; ++i) outs += g[i].defined() ? g[i].size(-1) : 0;
    const bool merged_dx = want_dx && detail::merge_for_dx(n, outs);  // dx = sum dy_i (W_i + s B_i A_i)
    const bool want_hlh = want_dx && !merged_dx;
    Tensor dt_hl = any_a ? parts(2 * total) : Tensor();
    Tensor dt_hlh = want_hlh ? parts(3 * total) : Tensor();
    std::vector<Tensor> dys(m);  // [n, out_i], undefined where output i got no gradient
    for (size_t i = 0; i < m; ++i) {
      if (!g[i].defined()) continue;
      const Tensor& dy = dys[i] = g[i].reshape({-1, g[i].size(-1)});
      if (node.needs_grad(grad_index(i, 2))) out[grad_index(i, 2)] = ops::sum_rows(dy, kept[i].bias_dtype);
      // dB, and dt = dy B ([n, out] x [out, 2r] parts, summed in f32) split into this adapter's columns.
      Tensor hl = any_a ? dt_hl.narrow(1, 2 * off[i], 2 * rank[i]) : Tensor();
      Tensor hlh = want_hlh ? dt_hlh.narrow(1, 3 * off[i], 3 * rank[i]) : Tensor();
      std::vector<std::string> patterns;
      if (any_a) patterns.push_back("hl");
      if (want_hlh) patterns.push_back("hlh");
      const bool want_db = node.needs_grad(grad_index(i, 1));
      detail::DyGrads d = detail::split_dy_grads(dy, t_keep[i], b_keep[i], scale, kept[i].b_dtype, want_db, patterns,
                                                 any_a ? &hl : &hlh, any_a && want_hlh ? &hlh : nullptr);
      if (want_db) out[grad_index(i, 1)] = std::move(d.db);
    }
    if (any_a) {  // [dA_1; dA_2; ..] = scale * DT^T x: one [2 total, n] x [n, in] product, each block summed
      const Tensor da = ops::matmul(dt_hl, x2, true, false, DType::f32);
      for (size_t i = 0; i < m; ++i)
        if (node.needs_grad(grad_index(i, 0)))
          out[grad_index(i, 0)] =
              detail::sum_row_parts(da.narrow(0, 2 * off[i], 2 * rank[i]), 2, scale).to(kept[i].a_dtype);
    }
    if (want_dx) {  // dx (+)= scale * DT_hlh [A1_hhl; A2_hhl; ..], then += dy_i W_i (or merged: see the top)
      const Tensor so_far = detail::grad_so_far(node, in);
      Tensor dx = so_far.defined() ? so_far : Tensor::empty({n, in}, DType::bf16, x2.device());
      bool written = so_far.defined();  // whether dx holds a sum to add onto
      if (!merged_dx) {
        ops::matmul_into(dt_hlh, keep_a_hhl, dx, false, false, scale, written ? 1.f : 0.f);
        written = true;
      }
      for (size_t i = 0; i < m; ++i) {
        if (!dys[i].defined()) continue;
        Tensor w = kept[i].weight.defined() ? kept[i].weight : kept[i].make_weight();
        if (merged_dx) w = detail::merged_weight(w, b_merge[i], keep_a_hhl.narrow(0, 3 * off[i], 3 * rank[i]), scale);
        ops::matmul_into(dys[i], w, dx, false, false, 1.f, written ? 1.f : 0.f);
        written = true;
      }
      if (!written) ops::fill_(dx, 0.f);  // no output had a gradient
      out[0] = dx.view(xshape);
    }
    return out;
  };
  return record(node_of(op, backward), inputs, std::move(ys));
}

}  // namespace loom::ag
