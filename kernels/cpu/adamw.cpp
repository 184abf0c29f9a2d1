// CPU reference for the AdamW step (kernels/adamw.h): OpenMP threads over the elements, the loop
// body branch-free (one instance per lerp form and bf16 copy) so that it vectorises; every
// operation stays one IEEE f32 rounding in the documented order (no FMA contraction, IEEE sqrt and
// division in vector form too), so the result is the same bit for bit as the scalar loop.
#include "kernels/adamw.h"

#include <cmath>

namespace loom::cpu {
namespace {

template <bool kSmall, bool kCopy, class G>
void adamw_loop(float* param, const G* grad, float* exp_avg, float* exp_avg_sq, int64_t n, const AdamWParams& p,
                const AdamWScalars& k, bf16* param_bf16) {
  const float beta2 = p.beta2, eps = p.eps, neg_step = -k.step_size;
  const float scale = p.grad_scale_at ? *p.grad_scale_at : p.grad_scale;
  const float w1 = k.w1, w1c = 1.f - k.w1, w2 = k.w2, decay = k.decay, bc2_sqrt = k.bc2_sqrt;
#pragma omp parallel for simd if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float g = to_acc(grad[i]) * scale;
    const float prm = param[i] * decay;
    float m = exp_avg[i];
    if constexpr (kSmall) m = m + w1 * (g - m);
    else m = g - (g - m) * w1c;
    float v = exp_avg_sq[i] * beta2;
    v = v + (w2 * g) * g;
    const float denom = std::sqrt(v) / bc2_sqrt + eps;
    const float out = prm + (neg_step * m) / denom;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = out;
    if constexpr (kCopy) param_bf16[i] = float_to_bf16(out);
  }
}

}  // namespace

template <class G>
void adamw_step(float* param, const G* grad, float* exp_avg, float* exp_avg_sq, int64_t n, const AdamWParams& p,
                bf16* param_bf16) {
  LOOM_CHECK(n >= 0, "adamw_step: n = ", n);
  LOOM_CHECK(p.step >= 1, "adamw_step: step is 1-based and already incremented, got ", p.step);
  if (n == 0) return;
  LOOM_CHECK(param && grad && exp_avg && exp_avg_sq, "adamw_step: null pointer");
  const AdamWScalars k = adamw_scalars(p);
  const bool small = adamw_lerp_weight_small(k.w1);
  if (small && param_bf16) adamw_loop<true, true>(param, grad, exp_avg, exp_avg_sq, n, p, k, param_bf16);
  else if (small) adamw_loop<true, false>(param, grad, exp_avg, exp_avg_sq, n, p, k, param_bf16);
  else if (param_bf16) adamw_loop<false, true>(param, grad, exp_avg, exp_avg_sq, n, p, k, param_bf16);
  else adamw_loop<false, false>(param, grad, exp_avg, exp_avg_sq, n, p, k, param_bf16);
}

template void adamw_step<float>(float*, const float*, float*, float*, int64_t, const AdamWParams&, bf16*);
template void adamw_step<bf16>(float*, const bf16*, float*, float*, int64_t, const AdamWParams&, bf16*);

}  // namespace loom::cpu
