// CPU reference for bitsandbytes' 8-bit blockwise AdamW and its 32-bit rule (kernels/adamw8bit.h).
#include "kernels/adamw8bit.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace loom::cpu {

template <class G>
void adamw8bit_step(float* param, const G* grad, uint8_t* state1, uint8_t* state2, float* absmax1, float* absmax2,
                    const float* qmap1, const float* qmap2, int64_t n, const AdamWParams& p, bf16* param_bf16) {
  LOOM_CHECK(n >= 0, "adamw8bit_step: n = ", n);
  LOOM_CHECK(p.step >= 1, "adamw8bit_step: step is 1-based and already incremented, got ", p.step);
  if (n == 0) return;
  LOOM_CHECK(param && grad && state1 && state2 && absmax1 && absmax2 && qmap1 && qmap2, "adamw8bit_step: null pointer");
  const Adam8bitScalars k = adam8bit_scalars(p);
  const int64_t blocks = adam8bit_blocks(n);
#pragma omp parallel for if (n > 65536)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kAdam8bitBlock, count = std::min<int64_t>(kAdam8bitBlock, n - lo);
    float m[kAdam8bitBlock], v[kAdam8bitBlock];
    bool finite[kAdam8bitBlock];
    const float a1 = absmax1[b], a2 = absmax2[b];
    float max1 = -FLT_MAX, max2 = -FLT_MAX;
    for (int64_t j = 0; j < kAdam8bitBlock; ++j) {
      const bool real = j < count;
      float g = real ? to_acc(grad[lo + j]) : 0.f;
      const uint8_t c1 = real ? state1[lo + j] : 128, c2 = real ? state2[lo + j] : 0;
      finite[j] = std::isfinite(g);
      if (finite[j]) {
        g = g * k.grad_scale;
        float vv = qmap2[c2] * a2;
        vv = vv * k.beta2 + (k.w2 * g) * g;
        float mm = qmap1[c1] * a1;
        mm = mm * k.beta1 + k.w1 * g;
        m[j] = mm;
        v[j] = vv;
      } else {
        m[j] = 0.f;
        v[j] = 0.f;
      }
      max1 = std::fmax(max1, std::fabs(m[j]));
      max2 = std::fmax(max2, std::fabs(v[j]));
    }
    absmax1[b] = max1;
    absmax2[b] = max2;
    for (int64_t j = 0; j < count; ++j) {
      const int64_t i = lo + j;
      if (finite[j]) {
        float out = param[i] + k.step_size * (m[j] / (std::sqrt(v[j]) + k.eps_c2));
        if (k.decay_on) out = out * k.decay;
        param[i] = out;
      }
      if (param_bf16) param_bf16[i] = float_to_bf16(param[i]);
      state1[i] = fix_sign(qmap1, quantize_dynamic(qmap1, m[j] / max1, true), m[j]);
      state2[i] = quantize_dynamic(qmap2, v[j] / max2, false);
    }
  }
}

namespace {
template <bool kDecay, bool kCopy, class G>
void adam32bit_loop(float* param, const G* grad, float* state1, float* state2, int64_t n, const Adam8bitScalars& k,
                    bf16* param_bf16) {
  const float scale = k.grad_scale, beta1 = k.beta1, beta2 = k.beta2, w1 = k.w1, w2 = k.w2;
  const float step_size = k.step_size, eps_c2 = k.eps_c2, decay = k.decay;
#pragma omp parallel for simd if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float g = to_acc(grad[i]) * scale;
    const float m = state1[i] * beta1 + w1 * g;
    const float v = state2[i] * beta2 + w2 * (g * g);
    float out = param[i] + step_size * (m / (std::sqrt(v) + eps_c2));
    if constexpr (kDecay) out = out * decay;
    state1[i] = m;
    state2[i] = v;
    param[i] = out;
    if constexpr (kCopy) param_bf16[i] = float_to_bf16(out);
  }
}
}  // namespace

// Branch-free instances (decay on or off, bf16 copy or not) so that the loop vectorises.
template <class G>
void adam32bit_step(float* param, const G* grad, float* state1, float* state2, int64_t n, const AdamWParams& p,
                    bf16* param_bf16) {
  LOOM_CHECK(n >= 0, "adam32bit_step: n = ", n);
  LOOM_CHECK(p.step >= 1, "adam32bit_step: step is 1-based and already incremented, got ", p.step);
  if (n == 0) return;
  LOOM_CHECK(param && grad && state1 && state2, "adam32bit_step: null pointer");
  const Adam8bitScalars k = adam8bit_scalars(p);
  if (k.decay_on && param_bf16) adam32bit_loop<true, true>(param, grad, state1, state2, n, k, param_bf16);
  else if (k.decay_on) adam32bit_loop<true, false>(param, grad, state1, state2, n, k, param_bf16);
  else if (param_bf16) adam32bit_loop<false, true>(param, grad, state1, state2, n, k, param_bf16);
  else adam32bit_loop<false, false>(param, grad, state1, state2, n, k, param_bf16);
}

template void adamw8bit_step<float>(float*, const float*, uint8_t*, uint8_t*, float*, float*, const float*,
                                    const float*, int64_t, const AdamWParams&, bf16*);
template void adamw8bit_step<bf16>(float*, const bf16*, uint8_t*, uint8_t*, float*, float*, const float*,
                                   const float*, int64_t, const AdamWParams&, bf16*);
template void adam32bit_step<float>(float*, const float*, float*, float*, int64_t, const AdamWParams&, bf16*);
template void adam32bit_step<bf16>(float*, const bf16*, float*, float*, int64_t, const AdamWParams&, bf16*);

}  // namespace loom::cpu
