// CUDA path of kernels/grad_norm.h: up to kPerLaunch gradients per launch, their values cut into
// chunks of kChunk; each block sums the squares of chunks blockIdx.x, + gridDim.x, ... into one
// partial; a last single-block kernel adds every launch's partials in order and writes norm and
// coefficient. Replaces three launches per gradient (sum of squares, its final pass, the add into
// the running total) and the host read that followed them.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/grad_norm.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256, kFinalThreads = 1024, kPerLaunch = 64, kMaxBlocks = 512;
constexpr int64_t kChunk = 16384;

struct Batch {  // kernel parameter (~1.4 KB)
  const void* data[kPerLaunch];
  int64_t n[kPerLaunch];
  int32_t chunk0[kPerLaunch + 1];  // first chunk of each gradient; chunk0[count] = the batch's chunks
  uint8_t bf16[kPerLaunch];
  int32_t count;
};

__global__ void __launch_bounds__(kThreads) grad_norm_partial_kernel(Batch b, float* __restrict__ partial) {
  float acc = 0.f;
  const int chunks = b.chunk0[b.count];
  int t = 0;
  for (int c = int(blockIdx.x); c < chunks; c += int(gridDim.x)) {
    while (b.chunk0[t + 1] <= c) ++t;  // chunks rise with c: the gradient index only moves forward
    const int64_t begin = int64_t(c - b.chunk0[t]) * kChunk, end = min(begin + kChunk, b.n[t]);
    if (b.bf16[t]) {
      const bf16* p = static_cast<const bf16*>(b.data[t]);
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
        const float v = load(p + i);
        acc += v * v;
      }
    } else {
      const float* p = static_cast<const float*>(b.data[t]);
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) acc += p[i] * p[i];
    }
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(kFinalThreads)
    grad_norm_final_kernel(const float* __restrict__ partial, int count, float max_norm, float* __restrict__ out) {
  float acc = 0.f;
  for (int i = threadIdx.x; i < count; i += kFinalThreads) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) {
    const float norm = sqrtf(acc);
    out[0] = norm;
    out[1] = clip_coefficient(norm, max_norm);
  }
}

}  // namespace

size_t grad_norm_workspace_floats(size_t spans) {
  const size_t launches = (spans + kPerLaunch - 1) / kPerLaunch;
  return std::max<size_t>(launches, 1) * kMaxBlocks;
}

void grad_norm_coef(const std::vector<GradSpan>& spans, float max_norm, float* out, float* workspace, Stream s) {
  LOOM_CHECK(out != nullptr && workspace != nullptr, "cuda::grad_norm_coef: null output or workspace");
  int partials = 0;
  for (size_t first = 0; first < spans.size(); first += kPerLaunch) {
    Batch b{};
    b.count = int(std::min<size_t>(kPerLaunch, spans.size() - first));
    int64_t chunks = 0;
    for (int i = 0; i < b.count; ++i) {
      const GradSpan& g = spans[first + i];
      LOOM_CHECK(g.n >= 0 && (g.n == 0 || g.data != nullptr), "cuda::grad_norm_coef: gradient ", first + i,
                 " has ", g.n, " values at ", g.data);
      b.data[i] = g.data;
      b.n[i] = g.n;
      b.bf16[i] = g.bf16 ? 1 : 0;
      b.chunk0[i] = int32_t(chunks);
      chunks += (g.n + kChunk - 1) / kChunk;
      LOOM_CHECK(chunks < (int64_t(1) << 31), "cuda::grad_norm_coef: too many values in one launch");
    }
    b.chunk0[b.count] = int32_t(chunks);
    const int blocks = int(std::clamp<int64_t>(chunks, 1, kMaxBlocks));
    grad_norm_partial_kernel<<<blocks, kThreads, 0, s>>>(b, workspace + partials);
    LOOM_CUDA_LAUNCH_CHECK();
    partials += blocks;
  }
  if (partials == 0) {  // no gradient: norm 0
    LOOM_CUDA_CHECK(cudaMemsetAsync(workspace, 0, sizeof(float), s));
    partials = 1;
  }
  grad_norm_final_kernel<<<1, kFinalThreads, 0, s>>>(workspace, partials, max_norm, out);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace loom::cuda
