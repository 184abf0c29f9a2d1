// CPU reference for the AdamW step (kernels/adamw.h).
#include "kernels/adamw.h"

#include <cmath>

namespace loom::cpu {

template <class G>
void adamw_step(float* param, const G* grad, float* exp_avg, float* exp_avg_sq, int64_t n, const AdamWParams& p,
                bf16* param_bf16) {
  LOOM_CHECK(n >= 0, "adamw_step: n = ", n);
  LOOM_CHECK(p.step >= 1, "adamw_step: step is 1-based and already incremented, got ", p.step);
  if (n == 0) return;
  LOOM_CHECK(param && grad && exp_avg && exp_avg_sq, "adamw_step: null pointer");
  const AdamWScalars k = adamw_scalars(p);
  const float beta2 = p.beta2, eps = p.eps, scale = p.grad_scale, neg_step = -k.step_size;
  const bool small = adamw_lerp_weight_small(k.w1);
  const float w1c = 1.f - k.w1;
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float g = to_acc(grad[i]) * scale;
    const float prm = param[i] * k.decay;
    float m = exp_avg[i];
    m = small ? m + k.w1 * (g - m) : g - (g - m) * w1c;
    float v = exp_avg_sq[i] * beta2;
    v = v + (k.w2 * g) * g;
    const float denom = std::sqrt(v) / k.bc2_sqrt + eps;
    const float out = prm + (neg_step * m) / denom;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = out;
    if (param_bf16) param_bf16[i] = float_to_bf16(out);
  }
}

template void adamw_step<float>(float*, const float*, float*, float*, int64_t, const AdamWParams&, bf16*);
template void adamw_step<bf16>(float*, const bf16*, float*, float*, int64_t, const AdamWParams&, bf16*);

}  // namespace loom::cpu
