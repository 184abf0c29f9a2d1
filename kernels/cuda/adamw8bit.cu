// CUDA 8-bit blockwise AdamW and bitsandbytes' 32-bit Adam rule (kernels/adamw8bit.h): one thread
// block of 256 per block of 256 elements (grid-stride over blocks), the code books in shared
// memory. Round-to-nearest intrinsics keep nvcc from fusing multiply-adds, so every value is
// rounded as on the CPU reference and the two agree bit for bit.
#include <cfloat>

#include "kernels/adamw8bit.h"
#include "kernels/cuda/cuda_common.cuh"

namespace loom::cuda {
namespace {

constexpr int kThreads = kAdam8bitBlock;  // one element per thread
static_assert(kThreads % 32 == 0 && kThreads <= 1024);

__device__ __forceinline__ float block_max(float v, float* partial) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();  // partial may still be read from the previous block
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < (kThreads >> 5) ? partial[lane] : -FLT_MAX;
  return warp_max(v);
}

template <class G>
__global__ __launch_bounds__(kThreads) void adamw8bit_kernel(float* __restrict__ param, const G* __restrict__ grad,
                                                              uint8_t* __restrict__ state1, uint8_t* __restrict__ state2,
                                                              float* __restrict__ absmax1, float* __restrict__ absmax2,
                                                              const float* __restrict__ qmap1,
                                                              const float* __restrict__ qmap2, int64_t n,
                                                              Adam8bitScalars k, bf16* __restrict__ param_bf16) {
  __shared__ float code1[256], code2[256];
  __shared__ float partial1[32], partial2[32];
  code1[threadIdx.x] = qmap1[threadIdx.x];
  code2[threadIdx.x] = qmap2[threadIdx.x];
  __syncthreads();
  const int64_t blocks = adam8bit_blocks(n);
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t i = b * kAdam8bitBlock + threadIdx.x;
    const bool real = i < n;
    float g = real ? load(grad + i) : 0.f;
    const uint8_t c1 = real ? state1[i] : 128, c2 = real ? state2[i] : 0;
    const float a1 = absmax1[b], a2 = absmax2[b];
    const bool finite = isfinite(g);
    float m = 0.f, v = 0.f;
    if (finite) {
      g = __fmul_rn(g, k.grad_scale);
      v = __fmul_rn(code2[c2], a2);
      v = __fadd_rn(__fmul_rn(v, k.beta2), __fmul_rn(__fmul_rn(k.w2, g), g));
      m = __fmul_rn(code1[c1], a1);
      m = __fadd_rn(__fmul_rn(m, k.beta1), __fmul_rn(k.w1, g));
    }
    const float max1 = block_max(fabsf(m), partial1);
    const float max2 = block_max(fabsf(v), partial2);
    if (threadIdx.x == 0) {  // every thread has read absmax[b] before the block_max barriers
      absmax1[b] = max1;
      absmax2[b] = max2;
    }
    if (!real) continue;
    float out = param[i];
    if (finite) {
      out = __fadd_rn(out, __fmul_rn(k.step_size, __fdiv_rn(m, __fadd_rn(__fsqrt_rn(v), k.eps_c2))));
      if (k.decay_on) out = __fmul_rn(out, k.decay);
      param[i] = out;
    }
    if (param_bf16) store(param_bf16 + i, out);
    state1[i] = fix_sign(code1, quantize_dynamic(code1, __fdiv_rn(m, max1), true), m);
    state2[i] = quantize_dynamic(code2, __fdiv_rn(v, max2), false);
  }
}

template <class G>
__global__ void adam32bit_kernel(float* __restrict__ param, const G* __restrict__ grad, float* __restrict__ state1,
                                 float* __restrict__ state2, int64_t n, Adam8bitScalars k,
                                 bf16* __restrict__ param_bf16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = __fmul_rn(load(grad + i), k.grad_scale);
    const float m = __fadd_rn(__fmul_rn(state1[i], k.beta1), __fmul_rn(k.w1, g));
    const float v = __fadd_rn(__fmul_rn(state2[i], k.beta2), __fmul_rn(k.w2, __fmul_rn(g, g)));
    float out = __fadd_rn(param[i], __fmul_rn(k.step_size, __fdiv_rn(m, __fadd_rn(__fsqrt_rn(v), k.eps_c2))));
    if (k.decay_on) out = __fmul_rn(out, k.decay);
    state1[i] = m;
    state2[i] = v;
    param[i] = out;
    if (param_bf16) store(param_bf16 + i, out);
  }
}

}  // namespace

template <class G>
void adamw8bit_step(float* param, const G* grad, uint8_t* state1, uint8_t* state2, float* absmax1, float* absmax2,
                    const float* qmap1, const float* qmap2, int64_t n, const AdamWParams& p, bf16* param_bf16,
                    Stream s) {
  LOOM_CHECK(n >= 0, "cuda adamw8bit_step: n = ", n);
  LOOM_CHECK(p.step >= 1, "cuda adamw8bit_step: step is 1-based and already incremented, got ", p.step);
  if (n == 0) return;
  LOOM_CHECK(param && grad && state1 && state2 && absmax1 && absmax2 && qmap1 && qmap2,
             "cuda adamw8bit_step: null pointer");
  const Adam8bitScalars k = adam8bit_scalars(p);
  adamw8bit_kernel<G><<<grid_for(adam8bit_blocks(n) * kThreads, kThreads, 8), kThreads, 0, s>>>(
      param, grad, state1, state2, absmax1, absmax2, qmap1, qmap2, n, k, param_bf16);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <class G>
void adam32bit_step(float* param, const G* grad, float* state1, float* state2, int64_t n, const AdamWParams& p,
                    bf16* param_bf16, Stream s) {
  LOOM_CHECK(n >= 0, "cuda adam32bit_step: n = ", n);
  LOOM_CHECK(p.step >= 1, "cuda adam32bit_step: step is 1-based and already incremented, got ", p.step);
  if (n == 0) return;
  LOOM_CHECK(param && grad && state1 && state2, "cuda adam32bit_step: null pointer");
  const Adam8bitScalars k = adam8bit_scalars(p);
  adam32bit_kernel<G><<<blocks_for(n, 256), 256, 0, s>>>(param, grad, state1, state2, n, k, param_bf16);
  LOOM_CUDA_LAUNCH_CHECK();
}

#define LOOM_INSTANTIATE(G)                                                                                       \
  template void adamw8bit_step<G>(float*, const G*, uint8_t*, uint8_t*, float*, float*, const float*, const float*, \
                                  int64_t, const AdamWParams&, bf16*, Stream);                                    \
  template void adam32bit_step<G>(float*, const G*, float*, float*, int64_t, const AdamWParams&, bf16*, Stream);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(bf16)
#undef LOOM_INSTANTIATE

}  // namespace loom::cuda
