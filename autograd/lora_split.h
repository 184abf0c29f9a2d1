// Internal to autograd/fn_lora*.cpp: the pieces of the bf16 LoRA product (fn_lora.cpp's top comment
// says how it works) that ag::lora_linear and ag::lora_linears share.
#pragma once
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "engine/ops.h"

namespace loom::ag::detail {

// [rows, cols] f32 -> bf16 [parts * rows, cols]: the parts stacked along the rows (a view of the
// flattened split).
Tensor split_rows(const Tensor& m, const std::string& pattern);
// [parts * rows, cols] f32 (contiguous) -> [rows, cols]: alpha times the sum of the stacked parts.
Tensor sum_row_parts(const Tensor& m, int parts, float alpha);
// x's gradient from its other consumers so far, as [rows, in], for dx to be added into by the GEMMs
// themselves, or undefined (see Node::take_grad_so_far).
Tensor grad_so_far(Node& n, int64_t in);

// A bf16 adapter's gradients that come from dy alone: dB = scale dy^T t from t's [t_hi, t_lo] parts
// ([n, 2r]; with want_db, in b_dtype), and dt = dy B from B's [B_hi, B_lo] parts ([out, 2r]), summed
// in f32 and split into each of `patterns` (the parts dA and dx take; written into into_a / into_b
// where given, as ops::block_sum_split). Where both are wanted, one pass over dy makes them
// (ops::lora_dy_products), else one GEMM each.
struct DyGrads {
  Tensor db;                     // undefined without want_db
  std::vector<Tensor> dt_parts;  // one per pattern
};
DyGrads split_dy_grads(const Tensor& dy, const Tensor& t_parts, const Tensor& b_parts, float scale, DType b_dtype,
                       bool want_db, const std::vector<std::string>& patterns, Tensor* into_a = nullptr,
                       Tensor* into_b = nullptr);

// What the forward of one bf16 adapter product keeps for backward.
struct SplitProduct {
  Tensor y;        // [n, out] (an unread value unless use is kRead)
  Tensor t_keep;   // t's [t_hi, t_lo] parts, [n, 2r]
  Tensor b_keep;   // [B_hi, B_lo] along the columns, [out, 2r] (row stride 4r)
  Tensor b_merge;  // [B_hi, B_lo, B_hi], [out, 3r] (the same storage): pairs with [A_hi; A_hi; A_lo]
  bool residual_added = false;  // y holds residual + the product (split_product's residual)
};

// dx through the merged weight. In bf16 without dropout (a bias changes nothing here), dx = dy W + s dt A equals
// dy (W + s B A): one GEMM over [tokens, out] x [out, in] (not accumulating where nothing came before),
// in place of the adapter's skinny product writing dx and the base GEMM reading it back in its
// epilogue. Making W + s B A reads and writes [out, in] once; the adapter's product and the epilogue
// read move [tokens, in] twice: so it is taken where the projections' outputs (summed over those that
// share x) are fewer than the tokens. The adapter's term then is rounded into bf16 together with W:
// each element of W + s B A carries at most half its own ulp of error, the same for every token of the
// step (the backward runs through a weight within bf16's rounding of the one the forward used, which
// itself is exact to ~16 bits); where |s B A| is below half an ulp of W, its share of dx is lost, as it
// is below the rounding of dx itself.
inline bool merge_for_dx(int64_t tokens, int64_t outs) { return outs < tokens; }
// W + scale B A in bf16 from b_merge (SplitProduct::b_merge, [out, 3r]) and a_hhl ([A_hi; A_hi; A_lo],
// [3r, in]), f32 accumulation, one rounding; laid out with W's row pitch, W left alone.
Tensor merged_weight(const Tensor& w, const Tensor& b_merge, const Tensor& a_hhl, float scale);
// The one-GEMM forward's operands (fn_lora.cpp's top): x2's and w's rows widened over their spare
// columns where both have room for t's parts, s B's and a bias's column (3r + 1) and nothing forbids it
// (dropout, an unread output); undefined otherwise.
struct OneGemm {
  Tensor x_ext, w_ext;
  int64_t in = 0;  // W's own columns (the spare ones after them)
  bool defined() const { return x_ext.defined(); }
};
OneGemm one_gemm_operands(const Tensor& x2, const Tensor& w, int64_t r, bool bias, const LoraArgs& lora, OutputUse use);
// B's parameter-only bf16 parts as jobs of one ops::block_sum_split_batch (with A's and the other
// adapters' of the call: one launch where each was two or three): [B_hi, B_hi, B_lo, B_hi] along the
// columns, returned ([out, 4r], written by the batch), and with the one GEMM s B's [hi, hi, lo] into
// W's spare columns.
Tensor add_b_splits(std::vector<ops::SplitJob>& jobs, const Tensor& b, const OneGemm& one, float scale);
// A's [A_hi; A_hi; A_lo] ([3r, in]) into a_hhl and, where a_hl is given, [A_hi; A_lo] into it, as a job of
// the batch.
void add_a_splits(std::vector<ops::SplitJob>& jobs, const Tensor& a, const Tensor& a_hhl, const Tensor* a_hl = nullptr);

// y = x2 w^T (+ bias) + scale t b^T in bf16 from t32 = x (A_hi + A_lo)^T ([n, 2r] f32, rows any pitch
// apart) and b_parts (add_b_splits'; with `one`, s B's parts are in W's spare columns already): one
// GEMM into x2's and w's spare columns where `one` has them, else the adapter's product first and the
// base GEMM adding onto it (with a bias: the base product, the bias, then the adapter's, as PEFT adds
// them).
// With residual ([n, out], contiguous, x2's dtype; use kRead), the GEMM that writes y first reads it as
// its C (apart from D: ops::matmul_into's c_in) where there is one: the one GEMM (a bias too) or, without a
// bias, the adapter's product (then rounded at the residual's magnitude before the base product is added).
// y = residual + the product with no pass of its own (residual_added; else the caller adds it).
SplitProduct split_product(const Tensor& x2, const Tensor& t32, const Tensor& w, const Tensor& b_parts,
                           const OneGemm& one, const Tensor* bias, const LoraArgs& lora, OutputUse use,
                           const Tensor* residual = nullptr);

}  // namespace loom::ag::detail
