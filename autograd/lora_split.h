// Internal to autograd/fn_lora*.cpp: the pieces of the bf16 LoRA product (fn_lora.cpp's top comment
// says how it works) that ag::lora_linear and ag::lora_linears share.
#pragma once
#include <string>

#include "autograd/functions.h"

namespace loom::ag::detail {

// [rows, cols] f32 -> bf16 [parts * rows, cols]: the parts stacked along the rows (a view of the
// flattened split).
Tensor split_rows(const Tensor& m, const std::string& pattern);
// [parts * rows, cols] f32 (contiguous) -> [rows, cols]: alpha times the sum of the stacked parts.
Tensor sum_row_parts(const Tensor& m, int parts, float alpha);
// x's gradient from its other consumers so far, as [rows, in], for dx to be added into by the GEMMs
// themselves, or undefined (see Node::take_grad_so_far).
Tensor grad_so_far(Node& n, int64_t in);

// dB = scale * dy^T t from t's [t_hi, t_lo] parts ([n, 2r]): [out, n] x [n, 2r] in f32, the two
// blocks summed, in B's dtype.
Tensor split_b_grad(const Tensor& dy, const Tensor& t_parts, float scale, DType b_dtype);

// What the forward of one bf16 adapter product keeps for backward.
struct SplitProduct {
  Tensor y;       // [n, out] (an unread value unless use is kRead)
  Tensor t_keep;  // t's [t_hi, t_lo] parts, [n, 2r]
  Tensor b_keep;  // [B_hi, B_lo] along the columns, [out, 2r] (row stride 3r)
};
// y = x2 w^T (+ bias) + scale t b^T in bf16 from t32 = x (A_hi + A_lo)^T ([n, 2r] f32, rows any pitch
// apart): one GEMM into x2's and w's spare columns where both have lora's room for it (x_spare,
// w_spare), else the adapter's product first and the base GEMM adding onto it (with a bias: the base
// product, the bias, then the adapter's, as PEFT adds them).
SplitProduct split_product(const Tensor& x2, const Tensor& t32, const Tensor& w, const Tensor& b, const Tensor* bias,
                           const LoraArgs& lora, OutputUse use);

}  // namespace loom::ag::detail
