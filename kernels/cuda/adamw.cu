// CUDA AdamW step (kernels/adamw.h): one grid-stride elementwise pass over param, grad and both
// moments. Explicit round-to-nearest intrinsics keep nvcc from fusing multiply-adds, so every
// value is rounded exactly as on the CPU reference (sqrtf and '/' are IEEE by default in nvcc).
#include "kernels/adamw.h"
#include "kernels/cuda/cuda_common.cuh"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

template <class G>
__global__ void adamw_kernel(float* __restrict__ param, const G* __restrict__ grad, float* __restrict__ exp_avg,
                             float* __restrict__ exp_avg_sq, int64_t n, AdamWScalars k, float beta2, float eps,
                             float scale, const float* __restrict__ scale_at, bf16* __restrict__ param_bf16) {
  if (scale_at) scale = *scale_at;
  const bool small = adamw_lerp_weight_small(k.w1);
  const float w1c = __fsub_rn(1.f, k.w1), neg_step = -k.step_size;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = __fmul_rn(load(grad + i), scale);
    const float prm = __fmul_rn(param[i], k.decay);
    float m = exp_avg[i];
    m = small ? __fadd_rn(m, __fmul_rn(k.w1, __fsub_rn(g, m))) : __fsub_rn(g, __fmul_rn(__fsub_rn(g, m), w1c));
    float v = __fmul_rn(exp_avg_sq[i], beta2);
    v = __fadd_rn(v, __fmul_rn(__fmul_rn(k.w2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), k.bc2_sqrt), eps);
    const float out = __fadd_rn(prm, __fdiv_rn(__fmul_rn(neg_step, m), denom));
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = out;
    if (param_bf16) store(param_bf16 + i, out);
  }
}

}  // namespace

template <class G>
void adamw_step(float* param, const G* grad, float* exp_avg, float* exp_avg_sq, int64_t n, const AdamWParams& p,
                bf16* param_bf16, Stream s) {
  LOOM_CHECK(n >= 0, "cuda adamw_step: n = ", n);
  LOOM_CHECK(p.step >= 1, "cuda adamw_step: step is 1-based and already incremented, got ", p.step);
  if (n == 0) return;
  LOOM_CHECK(param && grad && exp_avg && exp_avg_sq, "cuda adamw_step: null pointer");
  const AdamWScalars k = adamw_scalars(p);
  adamw_kernel<G><<<blocks_for(n, kThreads), kThreads, 0, s>>>(param, grad, exp_avg, exp_avg_sq, n, k, p.beta2,
                                                                 p.eps, p.grad_scale, p.grad_scale_at, param_bf16);
  LOOM_CUDA_LAUNCH_CHECK();
}

template void adamw_step<float>(float*, const float*, float*, float*, int64_t, const AdamWParams&, bf16*, Stream);
template void adamw_step<bf16>(float*, const bf16*, float*, float*, int64_t, const AdamWParams&, bf16*, Stream);

}  // namespace loom::cuda
