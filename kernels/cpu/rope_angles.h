// Internal to the CPU kernels: the rotary embedding's cosine and sine as every CPU rotation computes
// them (rope.cpp's rope_forward / rope_backward, and attention.cpp's backward, which undoes q's
// rotation before dq's one rounding): the same arithmetic gives the same values wherever a rotation is
// made or undone. kernels/cuda/rope_angles.cuh is the CUDA kernels' counterpart.
#pragma once
#include <cmath>

namespace loom::cpu {

// For frequency inv_freq at position pos: the angle pos * inv_freq rounded to f32 (as in Hugging Face),
// its cosine and sine in A, both times mscale (transformers: cos = cos(emb) * attention_scaling,
// LongRoPE's; one more rounding, skipped at 1), the sine times kSign (+1 the rotation, -1 its transpose).
template <int kSign, class A>
inline void rope_cos_sin(float pos, float inv_freq, float mscale, A& c, A& sn) {
  const A angle = A(pos * inv_freq);
  c = std::cos(angle), sn = std::sin(angle);
  if (mscale != 1.f) c *= A(mscale), sn *= A(mscale);
  sn *= A(kSign);
}

}  // namespace loom::cpu
