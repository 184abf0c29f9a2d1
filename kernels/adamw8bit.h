// 8-bit AdamW as bitsandbytes' AdamW8bit runs it on CUDA (kOptimizerStatic8bit2StateBlockwise,
// 0.50): both moments stored as 8-bit codes of dynamic maps (kernels/dynamic_map.h; signed for m,
// unsigned for v) with one f32 absmax per block of 256, and bitsandbytes' 32-bit Adam rule
// (kOptimizer32bit2State) that AdamW8bit uses for tensors under 4096 elements.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/adamw.h"
#include "kernels/common.h"

namespace loom {

inline constexpr int kAdam8bitBlock = 256;           // elements per absmax
inline constexpr int64_t kAdam8bitMinSize = 4096;    // smaller tensors keep f32 state
inline constexpr int64_t adam8bit_blocks(int64_t n) { return (n + kAdam8bitBlock - 1) / kAdam8bitBlock; }

// bitsandbytes' per-step scalars. It computes them in f32 with CUDA's approximate __powf and
// __fdividef; Loom takes beta^step in double and rounds once (the same value within an ulp or
// two), then follows bitsandbytes' f32 operation order:
//   c1 = 1 - beta1^t,  c2 = sqrt(1 - beta2^t),  step_size = (-lr * c2) / c1,  eps_c2 = c2 * eps,
//   decay = 1 - lr * weight_decay (applied after the update, only when weight_decay > 0).
struct Adam8bitScalars {
  float beta1, beta2, w1, w2, step_size, eps_c2, decay, grad_scale;
  bool decay_on;
};
inline Adam8bitScalars adam8bit_scalars(const AdamWParams& p) {
  const double t = static_cast<double>(p.step);
  const float c1 = static_cast<float>(1.0 - std::pow(double(p.beta1), t));
  const float c2 = static_cast<float>(std::sqrt(1.0 - std::pow(double(p.beta2), t)));
  Adam8bitScalars k;
  k.beta1 = p.beta1;
  k.beta2 = p.beta2;
  k.w1 = 1.f - p.beta1;
  k.w2 = 1.f - p.beta2;
  k.step_size = (-p.lr * c2) / c1;
  k.eps_c2 = c2 * p.eps;
  k.decay = 1.f - p.lr * p.weight_decay;
  k.grad_scale = p.grad_scale;
  k.decay_on = p.weight_decay > 0.f;
  return k;
}

// bitsandbytes' quantize_2D: binary search of x in the sorted 256-entry code, then the nearer of
// the two neighbours by their f32 midpoint. NaN (0/0 in an all-zero block) lands on code 0.
LOOM_HD uint8_t quantize_dynamic(const float* code, float x, bool is_signed) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = is_signed ? -1.f : 0.f, upper = 1.f, val = code[127];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = code[pivot];
  }
  if (x > val) return static_cast<uint8_t>(x > (upper + val) * 0.5f ? upper_pivot : pivot);
  return static_cast<uint8_t>(x < (lower + val) * 0.5f ? lower_pivot : pivot);
}

// bitsandbytes keeps m's sign through quantisation: a code of the other sign moves one step.
LOOM_HD bool sign_bit(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (u >> 31) != 0;
}
LOOM_HD uint8_t fix_sign(const float* code, uint8_t c, float m) {
  if (sign_bit(code[c]) != sign_bit(m)) c = static_cast<uint8_t>(m > 0.f ? c + 1 : c - 1);
  return c;
}

}  // namespace loom

// adamw8bit_step, per block b of 256 (the last one padded with g = 0, state1 code 128 and
// state2 code 0, which take part in the absmax as in bitsandbytes), all in f32:
//   for finite g (else m = v = 0 and param is left alone):
//     g *= grad_scale
//     v = qmap2[state2] * absmax2[b];  v = v * beta2 + (w2 * g) * g
//     m = qmap1[state1] * absmax1[b];  m = m * beta1 + w1 * g
//   absmax1[b] = max |m|, absmax2[b] = max |v| over the block (padding included)
//   param = param + step_size * (m / (sqrt(v) + eps_c2));  if decay_on: param = param * decay
//   state1 = fix_sign(quantize(qmap1, m / absmax1[b], signed)); state2 = quantize(qmap2, v / absmax2[b])
//   param_bf16 = bf16(param) when given.
// bitsandbytes divides with __fdividef and lets nvcc contract multiply-adds; Loom rounds every
// operation once (IEEE division, no FMA) so CPU and CUDA agree bit for bit.
//
// adam32bit_step (bitsandbytes' 32-bit rule, f32 state): g *= grad_scale;
//   m = m * beta1 + w1 * g;  v = v * beta2 + w2 * (g * g)
//   param = param + step_size * (m / (sqrt(v) + eps_c2));  if decay_on: param = param * decay
namespace loom::cpu {
template <class G>
void adamw8bit_step(float* param, const G* grad, uint8_t* state1, uint8_t* state2, float* absmax1, float* absmax2,
                    const float* qmap1, const float* qmap2, int64_t n, const AdamWParams& p, bf16* param_bf16);
template <class G>
void adam32bit_step(float* param, const G* grad, float* state1, float* state2, int64_t n, const AdamWParams& p,
                    bf16* param_bf16);
}  // namespace loom::cpu

namespace loom::cuda {
// qmap1/qmap2 are device pointers to the 256-entry maps.
template <class G>
void adamw8bit_step(float* param, const G* grad, uint8_t* state1, uint8_t* state2, float* absmax1, float* absmax2,
                    const float* qmap1, const float* qmap2, int64_t n, const AdamWParams& p, bf16* param_bf16,
                    Stream s);
template <class G>
void adam32bit_step(float* param, const G* grad, float* state1, float* state2, int64_t n, const AdamWParams& p,
                    bf16* param_bf16, Stream s);
}  // namespace loom::cuda
