// The rotary embedding's cosines and sines as every CUDA kernel that rotates computes them (rope.cu's
// kernels, and flash_attention.cu's last backward pass, which undoes q's rotation): the same arithmetic
// gives the same bits wherever a rotation is made or undone.
#pragma once
#include <cstdint>

namespace loom::cuda {

// For frequencies inv_freq[0 .. V) at position pos: angle = pos * inv_freq (one f32 product, as Hugging
// Face), sincosf (not __sinf: full range reduction for angles up to ~1e6 rad), both scaled by mscale
// (LongRoPE's attention scaling, else 1: exact), the sine by kSign (+1 forward, -1 the transpose).
template <int kSign, int V>
__device__ __forceinline__ void rope_angles(float pos, const float* inv_freq, float mscale, float (&c)[V],
                                            float (&sn)[V]) {
#pragma unroll
  for (int e = 0; e < V; ++e) {
    sincosf(pos * inv_freq[e], &sn[e], &c[e]);
    c[e] *= mscale;
    sn[e] *= mscale * static_cast<float>(kSign);
  }
}

}  // namespace loom::cuda
