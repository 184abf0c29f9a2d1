// Device pieces shared by the softmax cross-entropy kernels (cross_entropy.cu and the fused
// linear_cross_entropy.cu): Gemma 2's logit soft-cap, the target rule, and the online
// (max, sum of exp) pair that a row's log-sum-exp is streamed into and merged across threads.
#pragma once
#include <cstdint>

namespace loom::cuda::softmax {

__device__ __forceinline__ float capped(float x, float softcap) {
  return softcap > 0.f ? softcap * tanhf(x / softcap) : x;
}

// Whether target t carries a loss: not ignore_index and inside [0, vocab) (a kernel cannot throw,
// so out-of-range targets count as ignored).
__device__ __forceinline__ bool counts(int32_t t, int64_t vocab, int32_t ignore_index) {
  return t != ignore_index && t >= 0 && t < vocab;
}

// (m, l) <- (m, l) with one more logit z, where l = sum exp(z_j - m).
__device__ __forceinline__ void online_add(float& m, float& l, float z) {
  if (z > m) {
    l = l * expf(m - z) + 1.f;  // expf(-inf) = 0 on the first element
    m = z;
  } else if (z != -INFINITY) {  // NaN still enters the sum and poisons it, as it should
    l += expf(z - m);
  }
}

// (m, l) <- the pair describing both sets: l = sum exp(z - m) with m the larger maximum. Symmetric
// in its arguments bit for bit, so every lane of a butterfly ends with the same pair. m is never NaN
// (online_add only raises it); a NaN logit travels in l.
__device__ __forceinline__ void merge(float& m, float& l, float m2, float l2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) {  // both sets empty or all -inf (l = 0), or NaN logits only (l NaN)
    l += l2;
    return;
  }
  l = l * expf(m - mn) + l2 * expf(m2 - mn);
  m = mn;
}

}  // namespace loom::cuda::softmax
