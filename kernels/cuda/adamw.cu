// CUDA AdamW step (kernels/adamw.h): one grid-stride elementwise pass over param, grad and both
// moments; adamw_step_many gives each of many tensors its own blocks in one launch. Explicit round-to-nearest intrinsics keep nvcc from fusing multiply-adds, so every
// value is rounded exactly as on the CPU reference (sqrtf and '/' are IEEE by default in nvcc).
#include <algorithm>

#include "kernels/adamw.h"
#include "kernels/cuda/cuda_common.cuh"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

// Elements [first, n) of one tensor, stride apart.
template <class G>
__device__ __forceinline__ void adamw_elements(float* __restrict__ param, const G* __restrict__ grad,
                                               float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq, int64_t n,
                                               const AdamWScalars& k, float beta2, float eps, float scale,
                                               bf16* __restrict__ param_bf16, int64_t first, int64_t stride) {
  const bool small = adamw_lerp_weight_small(k.w1);
  const float w1c = __fsub_rn(1.f, k.w1), neg_step = -k.step_size;
  for (int64_t i = first; i < n; i += stride) {
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

template <class G>
__global__ void adamw_kernel(float* __restrict__ param, const G* __restrict__ grad, float* __restrict__ exp_avg,
                             float* __restrict__ exp_avg_sq, int64_t n, AdamWScalars k, float beta2, float eps,
                             float scale, const float* __restrict__ scale_at, bf16* __restrict__ param_bf16) {
  if (scale_at) scale = *scale_at;
  adamw_elements(param, grad, exp_avg, exp_avg_sq, n, k, beta2, eps, scale, param_bf16,
                 blockIdx.x * int64_t(blockDim.x) + threadIdx.x, int64_t(gridDim.x) * blockDim.x);
}

// Up to kSpansPerLaunch tensors a launch, passed by value (under the 4 KB of kernel parameters);
// blocks [first_block[j], first_block[j + 1]) update span j.
constexpr int kSpansPerLaunch = 32;
struct SpanBatch {
  AdamWSpan span[kSpansPerLaunch];
  int first_block[kSpansPerLaunch + 1];
  int count;
};
static_assert(sizeof(SpanBatch) <= 4000, "adamw_step_many: a batch must fit the kernel parameter space");

template <class G>
__global__ void adamw_many_kernel(const __grid_constant__ SpanBatch b, float beta2, float eps, float scale,
                                  const float* __restrict__ scale_at) {
  if (scale_at) scale = *scale_at;
  int j = 0;
  while (j + 1 < b.count && int(blockIdx.x) >= b.first_block[j + 1]) ++j;
  const AdamWSpan& sp = b.span[j];
  const int64_t blocks = b.first_block[j + 1] - b.first_block[j];
  adamw_elements(sp.param, static_cast<const G*>(sp.grad), sp.exp_avg, sp.exp_avg_sq, sp.n, sp.k, beta2, eps, scale,
                 sp.param_bf16, (int64_t(blockIdx.x) - b.first_block[j]) * blockDim.x + threadIdx.x,
                 blocks * blockDim.x);
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

template <class G>
void adamw_step_many(const AdamWSpan* spans, int64_t count, float beta2, float eps, float grad_scale,
                     const float* grad_scale_at, Stream s) {
  LOOM_CHECK(count >= 0 && (count == 0 || spans), "cuda adamw_step_many: ", count, " spans");
  for (int64_t first = 0; first < count; first += kSpansPerLaunch) {
    SpanBatch b{};
    b.count = static_cast<int>(std::min<int64_t>(kSpansPerLaunch, count - first));
    int64_t blocks = 0;
    for (int j = 0; j < b.count; ++j) {
      const AdamWSpan& sp = spans[first + j];
      LOOM_CHECK(sp.n >= 0 && (sp.n == 0 || (sp.param && sp.grad && sp.exp_avg && sp.exp_avg_sq)),
                 "cuda adamw_step_many: span ", first + j, " has n = ", sp.n, " or a null pointer");
      b.span[j] = sp;
      b.first_block[j] = static_cast<int>(blocks);
      blocks += blocks_for(sp.n, kThreads);  // adamw_step's grid for it (at least one block)
      LOOM_CHECK(blocks <= INT32_MAX, "cuda adamw_step_many: too many blocks");
    }
    b.first_block[b.count] = static_cast<int>(blocks);
    adamw_many_kernel<G><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(b, beta2, eps, grad_scale,
                                                                             grad_scale_at);
    LOOM_CUDA_LAUNCH_CHECK();
  }
}

template void adamw_step<float>(float*, const float*, float*, float*, int64_t, const AdamWParams&, bf16*, Stream);
template void adamw_step<bf16>(float*, const bf16*, float*, float*, int64_t, const AdamWParams&, bf16*, Stream);
template void adamw_step_many<float>(const AdamWSpan*, int64_t, float, float, float, const float*, Stream);
template void adamw_step_many<bf16>(const AdamWSpan*, int64_t, float, float, float, const float*, Stream);

}  // namespace loom::cuda
