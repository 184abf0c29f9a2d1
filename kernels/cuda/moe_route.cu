// CUDA kernels for kernels/moe.h, routing and the load-balancing loss: one warp per token, its
// logits in registers (PER = ceil(E / 32) per lane, expert e at lane e % 32, slot e / 32). No
// floating-point atomics: every result is the same bits run after run.
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/moe.h"

namespace loom::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarps = 4;  // warps per block of the warp-per-token kernels

// Calls f(std::integral_constant<int, PER>) for the smallest PER in {1, 2, 4, ..., 32} with
// 32 PER >= experts.
template <class F>
void with_per_lane(int64_t experts, F&& f) {
  if (experts <= 32) f(std::integral_constant<int, 1>{});
  else if (experts <= 64) f(std::integral_constant<int, 2>{});
  else if (experts <= 128) f(std::integral_constant<int, 4>{});
  else if (experts <= 256) f(std::integral_constant<int, 8>{});
  else if (experts <= 512) f(std::integral_constant<int, 16>{});
  else f(std::integral_constant<int, 32>{});
}

void check_route_shape(const char* op, int64_t tokens, int64_t experts, int64_t k) {
  LOOM_CHECK(tokens >= 0 && experts >= 1 && experts <= kMoeMaxExperts && k >= 1 && k <= kMoeMaxK && k <= experts, op,
             ": tokens ", tokens, ", experts ", experts, " (at most ", kMoeMaxExperts, "), top ", k, " (at most ",
             kMoeMaxK, ")");
}

unsigned warp_blocks(int64_t tokens) { return static_cast<unsigned>((tokens + kWarps - 1) / kWarps); }

// This warp's token (blockIdx.x kWarps + warp) and lane.
__device__ __forceinline__ int64_t warp_token() { return int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); }
__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }

// p[i] = softmax of the row l [experts] at expert 32 i + lane, as the CPU computes it:
// exp(l - max) / sum, 0 past the last expert.
template <int PER>
__device__ __forceinline__ void row_softmax(const float* l, int experts, float (&p)[PER]) {
  const int lane = lane_id();
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = i * 32 + lane;
    p[i] = e < experts ? l[e] : -INFINITY;
    mx = fmaxf(mx, p[i]);
  }
  mx = warp_max(mx);
  float z = 0.f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    p[i] = i * 32 + lane < experts ? expf(p[i] - mx) : 0.f;
    z += p[i];
  }
  z = warp_sum(z);
#pragma unroll
  for (int i = 0; i < PER; ++i) p[i] = p[i] / z;
}

// sum over j < k of lane j's v, added in j order (the CPU's order): every lane gets it.
__device__ __forceinline__ float sum_first_lanes(float v, int k) {
  float s = 0.f;
  for (int j = 0; j < k; ++j) s += __shfl_sync(kFull, v, j);
  return s;
}

// Grid ceil(T / kWarps) blocks of kWarps warps. Top k by repeated warp arg-max over 64-bit keys
// (probability bits, then the complemented expert: probabilities are >= 0, so their bits order as
// they do, and the lower expert wins a tie); a chosen key becomes 0, below every live key.
template <int PER>
__global__ void __launch_bounds__(kWarps * 32)
    route_forward_kernel(const float* logits, int32_t* ids, float* weights, int64_t tokens, int experts, int k,
                         bool renorm) {
  const int64_t t = warp_token();
  if (t >= tokens) return;  // the whole warp
  const int lane = lane_id();
  float p[PER];
  row_softmax<PER>(logits + t * experts, experts, p);
  unsigned long long key[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = i * 32 + lane;
    key[i] = e < experts ? (static_cast<unsigned long long>(__float_as_uint(p[i])) << 32) | ~static_cast<unsigned>(e)
                         : 0ull;
  }
  float mine_p = 0.f;  // lane j: the j-th choice
  int mine_e = 0;
  for (int j = 0; j < k; ++j) {
    unsigned long long best = 0;
#pragma unroll
    for (int i = 0; i < PER; ++i) best = key[i] > best ? key[i] : best;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const unsigned long long other = __shfl_xor_sync(kFull, best, o);
      best = other > best ? other : best;
    }
    const int e = static_cast<int>(~static_cast<unsigned>(best));
    if (lane == j) {
      mine_e = e;
      mine_p = __uint_as_float(static_cast<unsigned>(best >> 32));
    }
#pragma unroll
    for (int i = 0; i < PER; ++i)
      if (i * 32 + lane == e) key[i] = 0;
  }
  const float s = sum_first_lanes(mine_p, k);
  if (lane < k) {
    ids[t * k + lane] = mine_e;
    weights[t * k + lane] = renorm ? mine_p / s : mine_p;
  }
}

// Grid as the forward. dlogits row: renorm: w_j (dw_j - <dw, w>) at the chosen experts, else
// -p_e <dw, w> + w_j dw_j at expert id_j; each lane adds the chosen terms for its experts in j order.
template <int PER>
__global__ void __launch_bounds__(kWarps * 32)
    route_backward_kernel(const float* logits, const int32_t* ids, const float* weights, const float* dweights,
                          float* dlogits, int64_t tokens, int experts, int k, bool renorm) {
  const int64_t t = warp_token();
  if (t >= tokens) return;
  const int lane = lane_id();
  int id = -1;
  float w = 0.f, dw = 0.f;
  if (lane < k) {
    id = ids[t * k + lane];
    w = weights[t * k + lane];
    dw = dweights[t * k + lane];
  }
  const float dot = sum_first_lanes(dw * w, k);
  const float term = renorm ? w * (dw - dot) : w * dw;
  float acc[PER];
  if (renorm) {
#pragma unroll
    for (int i = 0; i < PER; ++i) acc[i] = 0.f;
  } else {
    row_softmax<PER>(logits + t * experts, experts, acc);
#pragma unroll
    for (int i = 0; i < PER; ++i) acc[i] = -acc[i] * dot;
  }
  for (int j = 0; j < k; ++j) {
    const int idj = __shfl_sync(kFull, id, j);
    const float tj = __shfl_sync(kFull, term, j);
#pragma unroll
    for (int i = 0; i < PER; ++i)
      if (i * 32 + lane == idj) acc[i] += tj;
  }
  float* dl = dlogits + t * experts;
#pragma unroll
  for (int i = 0; i < PER; ++i)
    if (i * 32 + lane < experts) dl[i * 32 + lane] = acc[i];
}

// ---- load-balancing loss ----

constexpr int kAuxWarps = 8;
constexpr int64_t kAuxMaxBlocks = 1024;

// Tokens per block of the probability sums: 64, or more so that there are at most kAuxMaxBlocks
// blocks (a multiple of kAuxWarps). Depends on N only, so the sums' order does too.
int64_t aux_tokens_per_block(int64_t tokens) {
  const int64_t per = (tokens + kAuxMaxBlocks - 1) / kAuxMaxBlocks;
  return per <= 64 ? 64 : (per + kAuxWarps - 1) / kAuxWarps * kAuxWarps;
}
int64_t aux_blocks(int64_t tokens) {
  const int64_t per = aux_tokens_per_block(tokens);
  return (tokens + per - 1) / per;
}

// counts[e] += how many of ids [n] are e (zeroed by the caller); a shared histogram per block.
// Integer atomics: the same counts whatever the order.
__global__ void count_experts_kernel(const int32_t* ids, int64_t n, int experts, int* counts) {
  extern __shared__ int hist[];
  for (int e = threadIdx.x; e < experts; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  for (int64_t a = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; a < n; a += int64_t(gridDim.x) * blockDim.x) {
    const int32_t e = ids[a];
    if (e >= 0 && e < experts) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x)
    if (hist[e] != 0) atomicAdd(&counts[e], hist[e]);
}

// Grid aux_blocks(T) blocks of kAuxWarps warps: partial[b, e] = sum of p_te over block b's `per`
// tokens (warp w takes every kAuxWarps-th token in order; the warps' sums are added in warp order).
template <int PER>
__global__ void __launch_bounds__(kAuxWarps * 32)
    aux_partial_kernel(const float* logits, int64_t tokens, int64_t per, int experts, float* partial) {
  extern __shared__ float warp_sums[];  // [kAuxWarps, experts]
  const int lane = lane_id(), warp = threadIdx.x >> 5;
  const int64_t first = int64_t(blockIdx.x) * per;
  const int64_t last = first + per < tokens ? first + per : tokens;
  float acc[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) acc[i] = 0.f;
  for (int64_t t = first + warp; t < last; t += kAuxWarps) {
    float p[PER];
    row_softmax<PER>(logits + t * experts, experts, p);
#pragma unroll
    for (int i = 0; i < PER; ++i) acc[i] += p[i];
  }
#pragma unroll
  for (int i = 0; i < PER; ++i)
    if (i * 32 + lane < experts) warp_sums[warp * experts + i * 32 + lane] = acc[i];
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    float s = 0.f;
    for (int w = 0; w < kAuxWarps; ++w) s += warp_sums[w * experts + e];
    partial[int64_t(blockIdx.x) * experts + e] = s;
  }
}

// Grid E blocks of 256 threads: terms[e] = (c_e / N) (sum_b partial[b, e] / N), the sum over the
// blocks a block reduction.
__global__ void __launch_bounds__(256)
    aux_expert_kernel(const float* partial, int64_t blocks, const int* counts, int64_t tokens, int experts,
                      float* terms) {
  const int e = blockIdx.x;
  float s = 0.f;
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) s += partial[b * experts + e];
  s = block_sum(s);
  const float n = static_cast<float>(tokens);
  if (threadIdx.x == 0) terms[e] = static_cast<float>(counts[e]) / n * (s / n);
}

// One block of 256 threads: loss = E sum_e terms[e].
__global__ void __launch_bounds__(256) aux_final_kernel(const float* terms, int experts, float* loss) {
  float t = 0.f;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) t += terms[e];
  t = block_sum(t);
  if (threadIdx.x == 0) *loss = t * static_cast<float>(experts);
}

// Grid as the routing kernels. g_e = dloss E c_e / N^2; dl_te = p_te (g_e - <g, p_t>).
template <int PER>
__global__ void __launch_bounds__(kWarps * 32)
    aux_backward_kernel(const float* logits, const int* counts, int64_t tokens, int experts, const float* dloss,
                        float* dlogits) {
  const int64_t t = warp_token();
  if (t >= tokens) return;
  const int lane = lane_id();
  const float n = static_cast<float>(tokens), scale = *dloss * static_cast<float>(experts);
  float p[PER], g[PER];
  row_softmax<PER>(logits + t * experts, experts, p);
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = i * 32 + lane;
    g[i] = e < experts ? scale * static_cast<float>(counts[e]) / (n * n) : 0.f;
    dot += g[i] * p[i];
  }
  dot = warp_sum(dot);
  float* dl = dlogits + t * experts;
#pragma unroll
  for (int i = 0; i < PER; ++i)
    if (i * 32 + lane < experts) dl[i * 32 + lane] = p[i] * (g[i] - dot);
}

unsigned count_blocks(int64_t n) { return grid_for(n, 256, 2); }

}  // namespace

void moe_route_forward(const float* logits, int32_t* ids, float* weights, int64_t tokens, int64_t experts, int64_t k,
                       bool renorm, Stream s) {
  check_route_shape("cuda::moe_route_forward", tokens, experts, k);
  if (tokens == 0) return;
  with_per_lane(experts, [&](auto per) {
    route_forward_kernel<decltype(per)::value><<<warp_blocks(tokens), kWarps * 32, 0, s>>>(
        logits, ids, weights, tokens, static_cast<int>(experts), static_cast<int>(k), renorm);
  });
  LOOM_CUDA_LAUNCH_CHECK();
}

void moe_route_backward(const float* logits, const int32_t* ids, const float* weights, const float* dweights,
                        float* dlogits, int64_t tokens, int64_t experts, int64_t k, bool renorm, Stream s) {
  check_route_shape("cuda::moe_route_backward", tokens, experts, k);
  if (tokens == 0) return;
  with_per_lane(experts, [&](auto per) {
    route_backward_kernel<decltype(per)::value><<<warp_blocks(tokens), kWarps * 32, 0, s>>>(
        logits, ids, weights, dweights, dlogits, tokens, static_cast<int>(experts), static_cast<int>(k), renorm);
  });
  LOOM_CUDA_LAUNCH_CHECK();
}

// Workspace: counts int [E], terms float [E], then partial float [aux_blocks(T), E].
size_t moe_aux_loss_workspace_bytes(int64_t tokens, int64_t experts) {
  return static_cast<size_t>((2 + aux_blocks(tokens)) * experts) * 4;
}

void moe_aux_loss(const float* logits, const int32_t* ids, int64_t tokens, int64_t experts, int64_t k, float* loss,
                  void* workspace, Stream s) {
  check_route_shape("cuda::moe_aux_loss", tokens, experts, k);
  LOOM_CHECK(tokens >= 1, "cuda::moe_aux_loss: no tokens");
  int* counts = static_cast<int*>(workspace);
  float* terms = reinterpret_cast<float*>(counts + experts);
  float* partial = terms + experts;
  const int64_t blocks = aux_blocks(tokens), per = aux_tokens_per_block(tokens);
  const int e = static_cast<int>(experts);
  LOOM_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int) * experts, s));
  count_experts_kernel<<<count_blocks(tokens * k), 256, sizeof(int) * experts, s>>>(ids, tokens * k, e, counts);
  LOOM_CUDA_LAUNCH_CHECK();
  with_per_lane(experts, [&](auto lanes) {
    aux_partial_kernel<decltype(lanes)::value><<<static_cast<unsigned>(blocks), kAuxWarps * 32,
                                                 sizeof(float) * kAuxWarps * experts, s>>>(logits, tokens, per, e,
                                                                                          partial);
  });
  LOOM_CUDA_LAUNCH_CHECK();
  aux_expert_kernel<<<static_cast<unsigned>(experts), 256, 0, s>>>(partial, blocks, counts, tokens, e, terms);
  LOOM_CUDA_LAUNCH_CHECK();
  aux_final_kernel<<<1, 256, 0, s>>>(terms, e, loss);
  LOOM_CUDA_LAUNCH_CHECK();
}

void moe_aux_loss_backward(const float* logits, const int32_t* ids, int64_t tokens, int64_t experts, int64_t k,
                           const float* dloss, float* dlogits, void* workspace, Stream s) {
  check_route_shape("cuda::moe_aux_loss_backward", tokens, experts, k);
  if (tokens == 0) return;
  int* counts = static_cast<int*>(workspace);
  LOOM_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int) * experts, s));
  count_experts_kernel<<<count_blocks(tokens * k), 256, sizeof(int) * experts, s>>>(ids, tokens * k,
                                                                                      static_cast<int>(experts), counts);
  LOOM_CUDA_LAUNCH_CHECK();
  with_per_lane(experts, [&](auto per) {
    aux_backward_kernel<decltype(per)::value><<<warp_blocks(tokens), kWarps * 32, 0, s>>>(
        logits, counts, tokens, static_cast<int>(experts), dloss, dlogits);
  });
  LOOM_CUDA_LAUNCH_CHECK();
}

// Workspace: chunk_counts int [chunks, E].

}  // namespace loom::cuda
