// CUDA kernel for kernels/attention_decode.h: one warp per (sequence, head), lanes split over
// head_dim (up to 256 = 8 values a lane), an online softmax over the cached keys.
#include "kernels/attention_decode.h"
#include "kernels/cuda/cuda_common.cuh"

namespace loom::cuda {
namespace {

constexpr int kMaxPerLane = 8;  // head_dim <= 256

template <class T>
__global__ void attention_decode_kernel(DecodeParams p, const T* q, const T* k, const T* v, T* out) {
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (warp >= p.batch * p.heads) return;
  const int64_t b = warp / p.heads, h = warp % p.heads, kvh = h / (p.heads / p.kv_heads);
  const int64_t D = p.head_dim;
  float qv[kMaxPerLane], acc[kMaxPerLane];
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    qv[i] = d < D ? load(q + warp * D + d) : 0.f;
    acc[i] = 0.f;
  }
  const int64_t first = p.window > 0 ? max(int64_t(0), p.length - p.window) : 0;
  float mx = -INFINITY, sum = 0.f;
  for (int64_t j = first; j < p.length; ++j) {
    const int64_t row = ((b * p.capacity + j) * p.kv_heads + kvh) * D;
    float dot = 0.f;
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < D) dot += qv[i] * load(k + row + d);
    }
    float s = warp_sum(dot) * p.scale;
    if (p.softcap > 0.f) s = p.softcap * tanhf(s / p.softcap);
    const float new_mx = nan_fmaxf(mx, s);
    const float correction = __expf(mx - new_mx), w = __expf(s - new_mx);
    sum = sum * correction + w;
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      acc[i] = acc[i] * correction + (d < D ? w * load(v + row + d) : 0.f);
    }
    mx = new_mx;
  }
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < D) store(out + warp * D + d, acc[i] / sum);
  }
}

}  // namespace

template <class T>
void attention_decode(const DecodeParams& p, const T* q, const T* k, const T* v, T* out, Stream s) {
  LOOM_CHECK(p.heads % p.kv_heads == 0 && p.length >= 1 && p.length <= p.capacity && p.head_dim <= 32 * kMaxPerLane,
             "attention_decode: bad params (heads ", p.heads, ", kv_heads ", p.kv_heads, ", length ", p.length,
             ", capacity ", p.capacity, ", head_dim ", p.head_dim, ")");
  const int64_t warps = p.batch * p.heads;
  if (warps == 0) return;
  const int threads = 128;
  attention_decode_kernel<<<static_cast<unsigned>((warps * 32 + threads - 1) / threads), threads, 0, s>>>(p, q, k, v, out);
  LOOM_CUDA_LAUNCH_CHECK();
}

template void attention_decode<float>(const DecodeParams&, const float*, const float*, const float*, float*, Stream);
template void attention_decode<bf16>(const DecodeParams&, const bf16*, const bf16*, const bf16*, bf16*, Stream);

}  // namespace loom::cuda
