// The AdamW update with torch.optim.AdamW semantics (non-amsgrad, non-fused, maximize=False) on
// f32 master weights and f32 moments; gradients in f32 or bf16; optional bf16 copy of the result.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/common.h"

namespace loom {

struct AdamWParams {
  float lr = 0.f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
  int64_t step = 1;        // 1-based, already incremented for this update
  float grad_scale = 1.f;  // gradients are multiplied by this first (clipping, loss-scale undo)
  // When set, the scale is read from here instead (memory of the device that runs the step: a
  // clipping coefficient the GPU computed, so the host need not wait for it).
  const float* grad_scale_at = nullptr;
};

// The per-step scalars, computed in double on the host as PyTorch does with Python floats, then
// rounded to f32 once:
//   decay = 1 - lr * weight_decay,   w1 = 1 - beta1,   w2 = 1 - beta2
//   step_size = lr / (1 - beta1^step),   bc2_sqrt = sqrt(1 - beta2^step)
struct AdamWScalars {
  float decay, w1, w2, step_size, bc2_sqrt;
};
inline AdamWScalars adamw_scalars(const AdamWParams& p) {
  const double lr = p.lr, b1 = p.beta1, b2 = p.beta2, t = static_cast<double>(p.step);
  const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
  return {static_cast<float>(1.0 - lr * double(p.weight_decay)), static_cast<float>(1.0 - b1),
          static_cast<float>(1.0 - b2), static_cast<float>(lr / bc1), static_cast<float>(std::sqrt(bc2))};
}

// PyTorch's lerp(self, end, w) in f32, as its scalar-weight kernels write it.
LOOM_HD bool adamw_lerp_weight_small(float w) { return w < 0.5f && w > -0.5f; }

}  // namespace loom

// For each i, with g = grad[i] * grad_scale (in f32) and the scalars above, as PyTorch's
// _single_tensor_adamw runs it on the CPU (each line one in-place op):
//   param = param * decay                             (param.mul_)
//   m = |w1| < 0.5 ? m + w1*(g - m) : g - (g - m)*(1 - w1)   (exp_avg.lerp_(grad, w1))
//   v = v * beta2;  v = v + (w2 * g) * g              (exp_avg_sq.mul_.addcmul_)
//   denom = sqrt(v) / bc2_sqrt + eps
//   param = param + (-step_size * m) / denom          (param.addcdiv_, CPU operand order)
//   param_bf16[i] = bf16(param)                       (when param_bf16 is not null)
// Every operation is one f32 rounding in this order on both backends (no fused multiply-add), so
// the CUDA result matches the CPU bit for bit.
namespace loom::cpu {
template <class G>
void adamw_step(float* param, const G* grad, float* exp_avg, float* exp_avg_sq, int64_t n, const AdamWParams& p,
                bf16* param_bf16);
}  // namespace loom::cpu

namespace loom::cuda {
template <class G>
void adamw_step(float* param, const G* grad, float* exp_avg, float* exp_avg_sq, int64_t n, const AdamWParams& p,
                bf16* param_bf16, Stream s);

// One tensor of adamw_step_many: adamw_step's arguments, with its own scalars (its lr, weight decay
// and step).
struct AdamWSpan {
  float* param;
  const void* grad;  // G
  float* exp_avg;
  float* exp_avg_sq;
  bf16* param_bf16;  // or null
  int64_t n;
  AdamWScalars k;
};
// adamw_step over many tensors in a few launches (a LoRA model's hundreds of small adapter tensors
// took one launch each, about 4 us of a mostly idle GPU apiece): every element updated as
// adamw_step updates it, bit for bit. beta2, eps and the gradient scale are the same for all.
template <class G>
void adamw_step_many(const AdamWSpan* spans, int64_t count, float beta2, float eps, float grad_scale,
                     const float* grad_scale_at, Stream s);
}  // namespace loom::cuda
