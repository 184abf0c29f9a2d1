// ops:: for the LoRA backward alone (autograd/fn_lora*.cpp), apart from ops.h that most of Loom
// includes.
#pragma once
#include "engine/tensor.h"

namespace loom::ops {

// The two skinny products a bf16 LoRA backward takes of dy, with one read of dy where the device has
// a kernel for it (kernels/lora_dy.h): dy [n, out] bf16, b [out, m r] and t [n, m r] bf16 whose m
// column blocks of r are summed as they enter (the [hi, lo] parts of B and of t); the rows of each
// any pitch apart (B's parts are two of four column blocks of [out, 4r]).
struct LoraDyProducts {
  Tensor dt;  // [n, r] f32 = sum_p dy b_p, or [n, m r] (dy b_p side by side) when dt_blocks = m
  Tensor db;  // [out, r] f32 = alpha sum_p dy^T t_p
  // dt's column blocks still to be summed: 1, or m where the two GEMMs ran (the caller's
  // block_sum_split sums them as it splits dt: one launch fewer than summing them here).
  int dt_blocks = 1;
};
LoraDyProducts lora_dy_products(const Tensor& dy, const Tensor& b, const Tensor& t, int m, float alpha);

}  // namespace loom::ops
