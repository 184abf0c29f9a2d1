// CUDA NF4 kernels (kernels/nf4.h). Quantise: one warp per block of 64 (two elements per lane, one
// packed byte each). Mean: one thread block summing fixed chunks in index order (the CPU's order).
// Double quantise: one thread block per 256 absmax values. Dequantise: one warp per 1024 elements,
// coalesced 16-byte stores, loads pipelined, the code books in shared memory. Every
// product and sum is an _rn intrinsic so nothing is fused and the CPU reference agrees bit for bit.
#include <cfloat>
#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/nf4.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kNf4DequantTile = 1024;  // elements per warp in the vector dequantise kernel

template <class T>
__global__ __launch_bounds__(kThreads) void nf4_quantize_kernel(const T* __restrict__ x, int64_t n,
                                                                 uint8_t* __restrict__ packed,
                                                                 float* __restrict__ absmax) {
  const int lane = threadIdx.x & 31;
  const int64_t blocks = nf4_blocks(n);
  for (int64_t b = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); b < blocks; b += int64_t(gridDim.x) * kWarps) {
    const int64_t i = b * kNf4Block + 2 * lane;
    const bool partial = (b + 1) * kNf4Block > n;
    const float a = i < n ? load(x + i) : 0.f, c = i + 1 < n ? load(x + i + 1) : 0.f;
    // As the CPU: a full block's max starts at -FLT_MAX, a partial one's counts its zero padding.
    float m = partial ? 0.f : -FLT_MAX;
    if (i < n) m = fmaxf(m, fabsf(a));
    if (i + 1 < n) m = fmaxf(m, fabsf(c));
    m = warp_max(m);
    if (lane == 0) absmax[b] = m;
    const float inv = __fdiv_rn(1.0f, m);
    if (i < n) packed[i / 2] = static_cast<uint8_t>(nf4_code_of(__fmul_rn(a, inv)) << 4 | nf4_code_of(__fmul_rn(c, inv)));
  }
}

// f64 sums of chunks of 1024 absmax values, each in index order, added in chunk order (one block).
constexpr int kMeanChunk = 1024;
__global__ __launch_bounds__(1024) void nf4_mean_kernel(const float* __restrict__ absmax, int64_t blocks,
                                                        float* __restrict__ out) {
  __shared__ double part[1024];
  double total = 0;
  const int64_t chunks = (blocks + kMeanChunk - 1) / kMeanChunk;
  for (int64_t g = 0; g < chunks; g += 1024) {
    const int64_t c = g + threadIdx.x;
    double s = 0;
    if (c < chunks) {
      const int64_t hi = min(blocks, (c + 1) * kMeanChunk);
      for (int64_t i = c * kMeanChunk; i < hi; ++i) s = __dadd_rn(s, double(absmax[i]));
    }
    part[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0)
      for (int64_t k = 0; k < 1024 && g + k < chunks; ++k) total = __dadd_rn(total, part[k]);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = float(__ddiv_rn(total, double(blocks)));
}

__global__ __launch_bounds__(kNf4NestedBlock) void nf4_double_quantize_kernel(
    const float* __restrict__ absmax, int64_t blocks, const float* __restrict__ offset_p,
    const float* __restrict__ code_g, uint8_t* __restrict__ qabsmax, float* __restrict__ nested_absmax) {
  __shared__ float code[256], partial[kNf4NestedBlock / 32];
  code[threadIdx.x] = code_g[threadIdx.x];
  const float offset = *offset_p;
  const int64_t nested = (blocks + kNf4NestedBlock - 1) / kNf4NestedBlock;
  for (int64_t nb = blockIdx.x; nb < nested; nb += gridDim.x) {
    const int64_t b = nb * kNf4NestedBlock + threadIdx.x;
    const bool partial_block = (nb + 1) * kNf4NestedBlock > blocks;
    const float a = b < blocks ? __fsub_rn(absmax[b], offset) : 0.f;
    float m = partial_block ? 0.f : -FLT_MAX;
    if (b < blocks) m = fmaxf(m, fabsf(a));
    m = warp_max(m);
    __syncthreads();  // code is loaded; partial is free from the previous block
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = m;
    __syncthreads();
    m = -FLT_MAX;
    for (int w = 0; w < kNf4NestedBlock / 32; ++w) m = fmaxf(m, partial[w]);
    if (threadIdx.x == 0) nested_absmax[nb] = m;
    const float inv = __fdiv_rn(1.0f, m);
    if (b < blocks) qabsmax[b] = blockwise_code_of(code, __fmul_rn(a, inv));
  }
}

// Shared-memory copies of the code books and the state with nested_code pointing at them.
struct SharedCodes {
  float nf4[16];
  float nested[256];
};
__device__ __forceinline__ Nf4State load_codes(const Nf4State& st, SharedCodes& sc) {
  constexpr float kCode[16] = LOOM_NF4_CODE;
  if (threadIdx.x < 16) sc.nf4[threadIdx.x] = kCode[threadIdx.x];
  Nf4State s = st;
  if (!st.absmax) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sc.nested[i] = st.nested_code[i];
    s.nested_code = sc.nested;
  }
  __syncthreads();
  return s;
}

// One warp per tile of 1024 elements; a lane handles 32 of them as chunks of one 16-byte store
// (8 bf16 or 4 f32), the warp's chunk c covering [1024 w + 32 E c, + 32 E): every load (4 or 2
// packed bytes per lane) and every store is coalesced. A chunk lies inside one block of 64, and a
// tile inside one block of 16384 (a second-level block): under double quantisation the tile's 16
// absmax codes are one 16-byte load every lane shares and its second-level absmax one float.
// A warp takes `iters` tiles, a grid stride apart, in a pipeline of kStages (2 or 3): the loads of
// the tile kStages - 1 ahead are issued before this tile is converted and stored, so each lane
// keeps that many tiles' loads in flight. The host sizes the grid to one resident wave.
static_assert(kNf4NestedBlock * kNf4Block % kNf4DequantTile == 0 && kNf4DequantTile / kNf4Block == 16);

template <class T, bool kNested>
struct DequantRaw {
  static constexpr int kE = 16 / int(sizeof(T));  // elements per chunk (one 16-byte store)
  static constexpr int kC = 32 / kE;              // chunks per lane
  uint32_t q[kC];                                 // each chunk's packed bytes
  // kNested: the tile's 16 absmax codes and its second-level absmax; else each chunk's absmax.
  std::conditional_t<kNested, uint4, float[kC]> a;
  float nested;
};

template <class T, bool kNested>
__device__ __forceinline__ void dequant_load(const uint8_t* __restrict__ packed, const Nf4State& s, int64_t tile,
                                             int lane, DequantRaw<T, kNested>& r) {
  using R = DequantRaw<T, kNested>;
  using Word = std::conditional_t<R::kE == 8, uint32_t, uint16_t>;
  const int64_t base = tile * kNf4DequantTile + int64_t(lane) * R::kE;
#pragma unroll
  for (int c = 0; c < R::kC; ++c) r.q[c] = __ldg(reinterpret_cast<const Word*>(packed + (base + 32 * R::kE * c) / 2));
  if constexpr (kNested) {
    r.a = __ldg(reinterpret_cast<const uint4*>(s.qabsmax + tile * (kNf4DequantTile / kNf4Block)));
    r.nested = __ldg(s.nested_absmax + tile * kNf4DequantTile / (int64_t(kNf4NestedBlock) * kNf4Block));
  } else {
#pragma unroll
    for (int c = 0; c < R::kC; ++c) r.a[c] = __ldg(s.absmax + (base + 32 * R::kE * c) / kNf4Block);
  }
}

template <class T, bool kNested>
__device__ __forceinline__ void dequant_store(const SharedCodes& sc, const Nf4State& s, const DequantRaw<T, kNested>& r,
                                              int64_t tile, int lane, T* __restrict__ out) {
  using R = DequantRaw<T, kNested>;
  const int64_t base = tile * kNf4DequantTile + int64_t(lane) * R::kE;
#pragma unroll
  for (int c = 0; c < R::kC; ++c) {
    float a;
    if constexpr (kNested) {
      // Chunk c lies in the tile's block j = (32 E c + E lane) / 64: byte j % 4 of word j / 4.
      const int j = (32 * R::kE * c + R::kE * lane) / kNf4Block;
      const uint32_t words[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
      const uint32_t code = (words[j >> 2] >> (8 * (j & 3))) & 0xffu;
      a = __fadd_rn(__fmul_rn(sc.nested[code], r.nested), s.offset);  // nf4_block_absmax's arithmetic
    } else {
      a = r.a[c];
    }
    float v[R::kE];
#pragma unroll
    for (int k = 0; k < R::kE / 2; ++k) {
      const uint32_t byte = (r.q[c] >> (8 * k)) & 0xffu;
      v[2 * k] = __fmul_rn(sc.nf4[byte >> 4], a);
      v[2 * k + 1] = __fmul_rn(sc.nf4[byte & 15], a);
    }
    store_vec<R::kE>(out + base + 32 * R::kE * c, v);
  }
}

// Without spills (ptxas, sm_90a): 40 registers for bf16 under double quantisation (6 blocks of 256
// threads per SM), 48 for f32 (5); with f32 absmax, 48 and 64 (5 and 4). A third stage costs one
// block per SM.
// The warps of gridDim.x blocks take `tiles` tiles of one tensor, a grid stride apart.
template <class T, bool kNested, int kStages>
__device__ __forceinline__ void dequantize_tiles(const uint8_t* __restrict__ packed, const SharedCodes& sc,
                                                 const Nf4State& s, int64_t tiles, T* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  const int64_t first = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  if constexpr (kStages == 2) {  // the same as the ring below, in fewer registers
    if (first >= tiles) return;
    DequantRaw<T, kNested> cur, next;
    dequant_load<T, kNested>(packed, s, first, lane, cur);
    for (int64_t w = first; w < tiles; w += warps) {
      const bool more = w + warps < tiles;
      if (more) dequant_load<T, kNested>(packed, s, w + warps, lane, next);
      dequant_store<T, kNested>(sc, s, cur, w, lane, out);
      if (more) cur = next;
    }
  } else {
    DequantRaw<T, kNested> raw[kStages];  // a ring: tile i's loads in raw[i % kStages]
#pragma unroll
    for (int k = 0; k + 1 < kStages; ++k)
      if (first + k * warps < tiles) dequant_load<T, kNested>(packed, s, first + k * warps, lane, raw[k]);
    for (int64_t w = first; w < tiles; w += kStages * warps) {
#pragma unroll
      for (int k = 0; k < kStages; ++k) {
        const int64_t t = w + k * warps, ahead = t + (kStages - 1) * warps;
        if (t >= tiles) break;
        if (ahead < tiles) dequant_load<T, kNested>(packed, s, ahead, lane, raw[(k + kStages - 1) % kStages]);
        dequant_store<T, kNested>(sc, s, raw[k], t, lane, out);
      }
    }
  }
}

template <class T, bool kNested, int kStages>
__global__ __launch_bounds__(kThreads, (sizeof(T) == 2 ? 5 : 4) + kNested - (kStages > 2)) void nf4_dequantize_vec_kernel(
    const uint8_t* __restrict__ packed, Nf4State st, int64_t tiles, T* __restrict__ out) {
  __shared__ SharedCodes sc;
  const Nf4State s = load_codes(st, sc);
  dequantize_tiles<T, kNested, kStages>(packed, sc, s, tiles, out);
}

// Up to kExpertChunk tensors of one size (a mixture-of-experts projection's experts, each quantised
// on its own), by value in the launch's arguments: blockIdx.y picks one, its blocks along x run the
// vector kernel's loop over its tiles.
constexpr int kExpertChunk = 64;
template <class T>
struct ExpertChunk {
  const uint8_t* packed[kExpertChunk];
  T* out[kExpertChunk];
  Nf4State state[kExpertChunk];
};
static_assert(sizeof(ExpertChunk<float>) < 4000, "kernel arguments are limited to 4 KiB");

// Whether the experts kernel takes these tensors: whole tiles, the vector kernel's alignments, and
// one kind of state (all double-quantised or all plain).
template <class T>
bool nf4_experts_batchable(const std::vector<const uint8_t*>& packed, const std::vector<Nf4State>& states, int64_t n,
                           const std::vector<T*>& out) {
  if (n % kNf4DequantTile != 0) return false;
  for (size_t e = 0; e < packed.size(); ++e) {
    const Nf4State& st = states[e];
    if (!packed[e] || !out[e] || (reinterpret_cast<uintptr_t>(packed[e]) & 3u) != 0 || !aligned16(out[e])) return false;
    if ((st.absmax == nullptr) != (states[0].absmax == nullptr)) return false;
    if (!st.absmax && !(st.qabsmax && st.nested_absmax && st.nested_code && aligned16(st.qabsmax))) return false;
  }
  return true;
}

template <class T, bool kNested, int kStages>
__global__ __launch_bounds__(kThreads, (sizeof(T) == 2 ? 5 : 4) + kNested - (kStages > 2)) void nf4_dequantize_experts_kernel(
    const __grid_constant__ ExpertChunk<T> chunk, int64_t tiles) {
  __shared__ SharedCodes sc;
  const int e = int(blockIdx.y);
  const Nf4State s = load_codes(chunk.state[e], sc);
  dequantize_tiles<T, kNested, kStages>(chunk.packed[e], sc, s, tiles, chunk.out[e]);
}

// Grid of the vector kernel: one resident wave (the occupancy the compiled kernel allows), every
// resident slot of every SM, so each SM holds the same number of warps and their tiles (a grid
// stride apart) differ by at most one per warp. Cutting the grid so that every warp takes the same
// number of tiles instead leaves the SMs with 5 or 6 blocks (bf16: 717 blocks on 132 SMs), those
// with 6 carrying a fifth more of the work. H200, [14336, 4096] double-quantised, 2 stages, same run
// (bench/results/2026-12-02-h200-session19.md): bf16 43.3 us (80.4 % of the copy roofline) against
// 44.7 us (77.9 %) with equal tiles per warp; f32 76.2 us (82.0 %) against 78.0 us (80.1 %).
template <class T, bool kNested, int kStages>
void launch_dequantize_vec(const uint8_t* packed, const Nf4State& state, int64_t tiles, T* out, Stream s) {
  auto* kernel = nf4_dequantize_vec_kernel<T, kNested, kStages>;
  static const int per_sm = [&] {
    int b = 0;
    LOOM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kThreads, 0));
    return b < 1 ? 1 : b;
  }();
  const int64_t slots = int64_t(sm_count()) * per_sm * kWarps;  // resident warps
  const int64_t warps = std::min(slots, tiles);
  kernel<<<unsigned((warps + kWarps - 1) / kWarps), kThreads, 0, s>>>(packed, state, tiles, out);
  LOOM_CUDA_LAUNCH_CHECK();
}

// Pipeline depth by element size: 2 stages for bf16 output, 3 for f32. H200, [14336, 4096]
// double-quantised, full grid, against the copy roofline (bench/results/2026-12-02-h200-session19.md
// and -session22.md): bf16 43.1-43.3 us (80.4-80.7 %) with 2 stages, 47.8 us (72.7-72.9 %) with 3
// (the third stage costs a block per SM and spills); f32 82.0-82.2 % with either, 3 ahead in two of
// the three runs (session 18, equal tiles per warp: 76.2 us with 2, 75.3 with 3).
template <class T, bool kNested>
void launch_dequantize_vec(const uint8_t* packed, const Nf4State& state, int64_t tiles, T* out, Stream s) {
  constexpr int kStages = sizeof(T) == 4 ? 3 : 2;
  launch_dequantize_vec<T, kNested, kStages>(packed, state, tiles, out, s);
}

// Elements [start, n), one per thread: the tail of the vector kernel or an unaligned tensor.
template <class T>
__global__ __launch_bounds__(kThreads) void nf4_dequantize_scalar_kernel(const uint8_t* __restrict__ packed,
                                                                          Nf4State st, int64_t start, int64_t n,
                                                                          T* __restrict__ out) {
  __shared__ SharedCodes sc;
  const Nf4State s = load_codes(st, sc);
  for (int64_t i = start + int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const uint8_t byte = packed[i / 2];
    store(out + i, __fmul_rn(sc.nf4[(i & 1) ? (byte & 15) : (byte >> 4)], nf4_block_absmax(s, i / kNf4Block)));
  }
}

}  // namespace

template <class T>
void nf4_quantize(const T* x, int64_t n, uint8_t* packed, float* absmax, Stream s) {
  LOOM_CHECK(n >= 0, "cuda nf4_quantize: n = ", n);
  if (n == 0) return;
  LOOM_CHECK(x && packed && absmax, "cuda nf4_quantize: null pointer");
  nf4_quantize_kernel<T><<<grid_for(nf4_blocks(n) * 32, kThreads, 8), kThreads, 0, s>>>(x, n, packed, absmax);
  LOOM_CUDA_LAUNCH_CHECK();
}

void nf4_absmax_mean(const float* absmax, int64_t blocks, float* offset_out, Stream s) {
  LOOM_CHECK(blocks > 0, "cuda nf4_absmax_mean: no blocks");
  LOOM_CHECK(absmax && offset_out, "cuda nf4_absmax_mean: null pointer");
  nf4_mean_kernel<<<1, 1024, 0, s>>>(absmax, blocks, offset_out);
  LOOM_CUDA_LAUNCH_CHECK();
}

void nf4_double_quantize(const float* absmax, int64_t blocks, const float* offset, const float* code,
                         uint8_t* qabsmax, float* nested_absmax, Stream s) {
  LOOM_CHECK(blocks >= 0, "cuda nf4_double_quantize: blocks = ", blocks);
  if (blocks == 0) return;
  LOOM_CHECK(absmax && offset && code && qabsmax && nested_absmax, "cuda nf4_double_quantize: null pointer");
  const int64_t nested = (blocks + kNf4NestedBlock - 1) / kNf4NestedBlock;
  nf4_double_quantize_kernel<<<grid_for(nested * kNf4NestedBlock, kNf4NestedBlock, 8), kNf4NestedBlock, 0, s>>>(
      absmax, blocks, offset, code, qabsmax, nested_absmax);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <class T>
void nf4_dequantize_experts(const std::vector<const uint8_t*>& packed, const std::vector<Nf4State>& states, int64_t n,
                            const std::vector<T*>& out, Stream s) {
  const size_t count = packed.size();
  LOOM_CHECK(states.size() == count && out.size() == count, "cuda nf4_dequantize_experts: ", count, " packed, ",
             states.size(), " states and ", out.size(), " outputs");
  if (count == 0 || n == 0) return;
  if (!nf4_experts_batchable(packed, states, n, out)) {  // one launch each, the tails and odd alignments included
    for (size_t e = 0; e < count; ++e) nf4_dequantize(packed[e], states[e], n, out[e], s);
    return;
  }
  const bool nested = states[0].absmax == nullptr;
  constexpr int kStages = sizeof(T) == 4 ? 3 : 2;
  auto launch = [&](auto kernel) {
    static const int per_sm = [&] {
      int b = 0;
      LOOM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kThreads, 0));
      return b < 1 ? 1 : b;
    }();
    const int64_t tiles = n / kNf4DequantTile;
    for (size_t first = 0; first < count; first += kExpertChunk) {
      ExpertChunk<T> chunk{};
      const int k = int(std::min<size_t>(kExpertChunk, count - first));
      for (int i = 0; i < k; ++i)
        chunk.packed[i] = packed[first + i], chunk.out[i] = out[first + i], chunk.state[i] = states[first + i];
      // One resident wave over the chunk's tensors together, as the single-tensor kernel sizes its grid.
      const int64_t slots = int64_t(sm_count()) * per_sm * kWarps;
      const int64_t warps = std::min(std::max<int64_t>(slots / k, kWarps), tiles);
      kernel<<<dim3(unsigned((warps + kWarps - 1) / kWarps), unsigned(k)), kThreads, 0, s>>>(chunk, tiles);
      LOOM_CUDA_LAUNCH_CHECK();
    }
  };
  if (nested) launch(nf4_dequantize_experts_kernel<T, true, kStages>);
  else launch(nf4_dequantize_experts_kernel<T, false, kStages>);
}

template <class T>
void nf4_dequantize(const uint8_t* packed, const Nf4State& state, int64_t n, T* out, Stream s) {
  LOOM_CHECK(n >= 0, "cuda nf4_dequantize: n = ", n);
  if (n == 0) return;
  LOOM_CHECK(packed && out, "cuda nf4_dequantize: null pointer");
  LOOM_CHECK(state.absmax || (state.qabsmax && state.nested_absmax && state.nested_code),
             "cuda nf4_dequantize: the state has neither absmax nor the nested (qabsmax, nested_absmax, code) triple");
  // The vector kernel: 4-byte aligned codes, 16-byte aligned output and (double quantisation) absmax codes.
  const bool vec = (reinterpret_cast<uintptr_t>(packed) & 3u) == 0 && aligned16(out) &&
                   (state.absmax || aligned16(state.qabsmax));
  const int64_t tiles = vec ? n / kNf4DequantTile : 0;
  if (tiles > 0) {
    if (state.absmax) launch_dequantize_vec<T, false>(packed, state, tiles, out, s);
    else launch_dequantize_vec<T, true>(packed, state, tiles, out, s);
  }
  const int64_t start = tiles * kNf4DequantTile;
  if (start < n) {
    nf4_dequantize_scalar_kernel<T><<<grid_for(n - start, kThreads, 8), kThreads, 0, s>>>(packed, state, start, n, out);
    LOOM_CUDA_LAUNCH_CHECK();
  }
}

template void nf4_quantize<float>(const float*, int64_t, uint8_t*, float*, Stream);
template void nf4_quantize<bf16>(const bf16*, int64_t, uint8_t*, float*, Stream);
template void nf4_dequantize<float>(const uint8_t*, const Nf4State&, int64_t, float*, Stream);
template void nf4_dequantize<bf16>(const uint8_t*, const Nf4State&, int64_t, bf16*, Stream);
template void nf4_dequantize_experts<float>(const std::vector<const uint8_t*>&, const std::vector<Nf4State>&, int64_t,
                                            const std::vector<float*>&, Stream);
template void nf4_dequantize_experts<bf16>(const std::vector<const uint8_t*>&, const std::vector<Nf4State>&, int64_t,
                                           const std::vector<bf16*>&, Stream);

}  // namespace loom::cuda
