// The kSm90 / kSm90Wide grouped GEMM (kernels/grouped_gemm.h): every expert's bf16 product in one
// persistent launch of Hopper wgmma, 128 x 128 (kSm90) or 128 x 256 (kSm90Wide) output tiles of all
// the problems shared out over the SMs, their operands streamed through a 5-stage (4-stage) cp.async
// pipeline into 128-byte-swizzled shared memory. The wide tiles load 48 KiB of operands a k-step for
// twice the products of 32 KiB: Qwen3-30B-A3B's expert products ran 14-17 % faster on the H200
// (session 33: gate_up forward 893 us against 1,041).
//
// Design (one block per SM, 256 threads = 2 warpgroups that both load and multiply):
// - Tiles: a problem (C [M, N] = op(A) op(B), K deep) has ceil(M/128) x ceil(N/kBN) output tiles,
//   M-tiles fastest; problem p's tiles follow problem p-1's in one linear index, and block b takes
//   tiles b, b + grid, b + 2 grid, ... A Cursor walks that index over the problem list, which it
//   reads from device memory (a later version can derive the per-expert row counts from device
//   offsets the same way). Warpgroup w owns rows 64 w .. 64 w + 63 of a tile: m64n128k16 (m64n256k16)
//   wgmmas, 64 (128) f32 accumulators per thread.
// - Pipeline: the block's k-steps (64 deep) of all its tiles form one stream; a load cursor runs
//   kStages - 2 k-steps ahead of the multiply cursor, across tile boundaries, so the next tile's
//   first operands arrive while this tile's last wgmmas and epilogue run. Step j reads stage
//   j % kStages and loads step j + kStages - 2 into stage (j - 2) % kStages, which wgmma step j - 2
//   of both warpgroups has released (each waits for all but its newest group before the barrier
//   of step j). One commit group per step, empty or not, keeps the cp.async accounting uniform.
// - Operands: A is K-major ([M, K] rows, trans_a false) or MN-major ([K, M] rows, trans_a), B is
//   K-major ([N, K], trans_b) or MN-major ([K, N], trans_b false); wgmma reads either from the
//   swizzled tiles of kernels/cuda/wgmma.cuh through its transpose bits. Loads zero-fill rows and
//   16-byte column chunks outside the problem, so a reduction depth (K) that ends mid-step sums
//   zeros, and nothing outside A, B or C is read. K = 0 is one step of zeros: C = beta C.
// - Two products into one output (sm90_grouped_gemm's `second`, a LoRA term folded into its base
//   product): a problem's k-steps are those of A B, then those of A2 B2 (its own depth k2 and leading
//   dimensions, the same layouts), all into the same accumulators: C = alpha (A B + A2 B2) + beta C.
// - Epilogue: straight from the accumulators to global memory, pairs of columns, rows and columns
//   outside the problem skipped; C = alpha acc + beta C (C not read when beta is 0).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/grouped_gemm_store.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/grouped_gemm.h"

namespace loom::cuda {
namespace {

using wgmma::Wgmma;

constexpr int kBM = 128, kBK = 64;  // output tile rows, k-step
constexpr int kThreads = 256;       // 2 warpgroups of 64 tile rows
static_assert(kBM == 64 * (kThreads / 128), "one warpgroup per 64 rows");
static_assert(kBK == 64, "a k-step is one 128-byte swizzle row of a K-major tile");

// The output tile's width (kSm90: 128, kSm90Wide: 256) fixes the rest: a stage holds one k-step of A
// (kBM x kBK) and of B (kBN x kBK), as many stages as fit (5 of 32 KiB, 4 of 48 KiB).
template <int kBN>
struct Shape {
  static_assert(kBN == 128 || kBN == 256, "m64n128 or m64n256 wgmmas");
  static constexpr int kAElems = kBM * kBK, kBElems = kBN * kBK, kStageElems = kAElems + kBElems;
  static constexpr int kStages = kBN == 128 ? 5 : 4;  // 3 (2) k-steps in flight while one is multiplied
  static_assert(kStages >= 3, "the stage being loaded is two steps behind the one multiplied");
  static constexpr size_t kSmemBytes = size_t(kStages) * kStageElems * sizeof(bf16) + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "Hopper gives a block at most 227 KiB of shared memory");
  // The epilogue's old C values are loaded for this many 8-column groups at a time (all of a
  // 128-wide tile; a quarter of a 256-wide one, whose 128 accumulators leave no room for more).
  static constexpr int kOldGroups = kBN == 128 ? 16 : 8;
};

// One problem as the kernel reads it (device memory, written by write_problems). a2, b2: the second
// product's operands (k2 = 0 when there is none; they then repeat a and b, which are never read for it).
struct Problem {
  const bf16* a;
  const bf16* b;
  void* c;
  const bf16* a2;
  const bf16* b2;
  int32_t m, n, k, lda, ldb, ldc;
  int32_t k2, lda2, ldb2, unused;
};
static_assert(sizeof(Problem) == 80 && alignof(Problem) == 8, "10 pointer slots per problem");
static_assert(sizeof(Problem) <= kSm90SlotsPerProblem * sizeof(void*), "grouped_gemm_pointer_slots covers a problem");

__device__ __forceinline__ int cdiv(int a, int b) { return (a + b - 1) / b; }

// Walks the block's tiles (tile, tile + stride, ...) over the problems and the k-steps of each.
template <int kBN>
struct Cursor {
  Problem prob;
  int64_t tile, start;  // the linear tile index; the first tile of problem p
  int p, tiles, tm_count;
  int m0, n0, kt, kt_count, kt_first;  // kt_first: the k-steps of A B (then those of A2 B2)

  __device__ __forceinline__ bool valid(int count) const { return p < count; }
  __device__ __forceinline__ void enter(const Problem* problems) {
    prob = problems[p];
    tm_count = cdiv(prob.m, kBM);
    tiles = tm_count * cdiv(prob.n, kBN);
  }
  // Finds the problem that owns `tile` (problems without tiles own none) and starts its first k-step.
  __device__ __forceinline__ void seek(const Problem* problems, int count) {
    while (p < count && tile >= start + tiles) {
      start += tiles;
      if (++p < count) enter(problems);
    }
    if (p < count) {
      const int local = int(tile - start);
      m0 = (local % tm_count) * kBM;
      n0 = (local / tm_count) * kBN;
      kt = 0;
      kt_first = cdiv(prob.k, kBK);
      kt_count = max(1, kt_first + cdiv(prob.k2, kBK));
    }
  }
  __device__ __forceinline__ void init(const Problem* problems, int count, int64_t first) {
    p = 0, start = 0, tile = first;
    enter(problems);
    seek(problems, count);
  }
  __device__ __forceinline__ void next_tile(const Problem* problems, int count, int64_t stride) {
    tile += stride;
    seek(problems, count);
  }
  __device__ __forceinline__ void advance(const Problem* problems, int count, int64_t stride) {
    if (++kt == kt_count) next_tile(problems, count, stride);
  }
};

// The cp.async loaders of one operand's tile: K-major, rows (M or N) x 64 columns (K); MN-major,
// 64 rows (K) x `kRows` columns (64-column blocks), as wgmma::sw128 lays them out.
template <int kRows>
struct Loaders {
  wgmma::TileLoader<kRows, kBK, kThreads> k_major;
  wgmma::TileLoader<kBK, kRows, kThreads> mn_major;
  __device__ __forceinline__ explicit Loaders(int tid) : k_major(tid), mn_major(tid) {}
};

// k-step `c.kt` of the cursor's tile into the stage's A and B tiles (rows/columns past the problem
// are zeros).
template <bool kTransA, bool kTransB, int kBN>
__device__ __forceinline__ void load_step(const Cursor<kBN>& c, bf16* sA, bf16* sB, const Loaders<kBM>& la,
                                          const Loaders<kBN>& lb) {
  const Problem& p = c.prob;
  // The first product's k-steps, then the second's (K = 0 with no second product: one step of zeros
  // from the first's operands).
  const bool first = c.kt < c.kt_first || p.k2 == 0;
  const bf16* a = first ? p.a : p.a2;
  const bf16* b = first ? p.b : p.b2;
  const int64_t lda = first ? p.lda : p.lda2, ldb = first ? p.ldb : p.ldb2;
  const int depth = first ? p.k : p.k2;
  const int k0 = (first ? c.kt : c.kt - c.kt_first) * kBK;
  if constexpr (!kTransA) la.k_major.load(sA, a + k0, lda, c.m0, p.m, depth - k0);  // A [M, K]
  else la.mn_major.load(sA, a + c.m0, lda, k0, depth, p.m - c.m0);                  // A [K, M]
  if constexpr (kTransB) lb.k_major.load(sB, b + k0, ldb, c.n0, p.n, depth - k0);   // B [N, K]
  else lb.mn_major.load(sB, b + c.n0, ldb, k0, depth, p.n - c.n0);                  // B [K, N]
}

// C [m0 + 64 wg .., n0 ..] = alpha acc + beta C from one warpgroup's m64nN accumulators (the
// layout and the loads of old values before the stores: kernels/cuda/grouped_gemm_store.cuh).
template <class TC, int kBN>
__device__ __forceinline__ void store_tile(const Cursor<kBN>& c, const float (&acc)[kBN / 2], int wg, int warp,
                                           int lane, float alpha, float beta) {
  const Problem& p = c.prob;
  grouped::store_acc<TC, kBN, Shape<kBN>::kOldGroups>(static_cast<TC*>(p.c), p.ldc,
                                                      c.m0 + 64 * wg + 16 * (warp & 3) + (lane >> 2), p.m,
                                                      c.n0 + 2 * (lane & 3), p.n, acc, alpha, beta);
}

template <bool kTransA, bool kTransB, class TC, int kBN>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_sm90_kernel(const Problem* __restrict__ problems, int count, float alpha, float beta) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = Shape<kBN>;
  constexpr int kStages = S::kStages, kStageElems = S::kStageElems;
  extern __shared__ unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw + ((1024 - (flash::smem_u32(smem_raw) & 1023)) & 1023));
  // Stage s: A tile at smem + s kStageElems, B tile after it (both 1024-byte aligned).
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, wg = wgmma::warpgroup();
  const int64_t stride = gridDim.x;
  const Loaders<kBM> la(tid);
  const Loaders<kBN> lb(tid);

  Cursor<kBN> mma;
  mma.init(problems, count, blockIdx.x);
  if (!mma.valid(count)) return;  // the same for every thread of the block
  Cursor<kBN> load = mma;

  // Prologue: k-steps 0 .. kStages - 3 into stages 0 .. kStages - 3.
#pragma unroll
  for (int s = 0; s < kStages - 2; ++s) {
    if (load.valid(count)) {
      load_step<kTransA, kTransB, kBN>(load, smem + s * kStageElems, smem + s * kStageElems + S::kAElems, la, lb);
      load.advance(problems, count, stride);
    }
    flash::cp_async_commit();
  }

  float acc[kBN / 2];
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.f;
  int stage = 0, load_stage = kStages - 2;
  // Tiles, then their k-steps in a loop of its own: a wgmma group left running across the back edge
  // of the outer loop (with its branches and the cursor's walk) makes ptxas wait for it there.
  while (mma.valid(count)) {
    for (int kt = 0; kt < mma.kt_count; ++kt) {
      // (a) Step j's operands have landed (this thread's groups, then everyone's), and wgmma step
      // j - 2 of both warpgroups is done: its stage, load_stage, may be overwritten.
      flash::cp_async_wait<kStages - 3>();
      wgmma::fence_proxy_async();
      __syncthreads();

      // (b) acc (+)= A B over this k-step: 4 wgmmas of k16; the tile's first step starts from zero.
      {
        const bf16* sA = smem + stage * kStageElems;
        const bf16* sB = sA + S::kAElems;
        const uint64_t da = kTransA ? wgmma::tile_desc(sA, kBK * 128) + uint64_t((wg * kBK * 128) >> 4)
                                    : wgmma::tile_desc(sA, 16);
        const uint64_t db = kTransB ? wgmma::tile_desc(sB, 16) : wgmma::tile_desc(sB, kBK * 128);  // 64-column blocks
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          const uint64_t a = kTransA ? wgmma::desc_mn_major<kBK>(da, kk) : wgmma::desc_k_major<kBM>(da, 64 * wg, kk);
          const uint64_t b = kTransB ? wgmma::desc_k_major<kBN>(db, 0, kk) : wgmma::desc_mn_major<kBK>(db, kk);
          Wgmma<kBN>::template ss<kTransA ? 1 : 0, kTransB ? 0 : 1>(acc, a, b, (kt == 0 && kk == 0) ? 0 : 1);
        }
        wgmma::commit();
      }

      // (c) Prefetch step j + kStages - 2 (of this tile or a later one) into the stage step j - 2 used.
      if (load.valid(count)) {
        load_step<kTransA, kTransB, kBN>(load, smem + load_stage * kStageElems,
                                         smem + load_stage * kStageElems + S::kAElems, la, lb);
        load.advance(problems, count, stride);
      }
      flash::cp_async_commit();
      load_stage = load_stage + 1 == kStages ? 0 : load_stage + 1;
      stage = stage + 1 == kStages ? 0 : stage + 1;

      // (d) Step j - 1's wgmmas are done; step j's may still run.
      wgmma::wait<1>();
    }
    // (e) The tile's wgmmas are all done: the epilogue, then the block's next tile.
    wgmma::wait<0>();
    wgmma::fence_regs(acc);
    store_tile<TC, kBN>(mma, acc, wg, warp, lane, alpha, beta);
    mma.next_tile(problems, count, stride);
  }
  flash::cp_async_wait<0>();  // only empty groups remain
#else
  __trap();  // built without sm_90a: sm90_grouped_gemm never launches it then (flash::sm90_ready())
#endif
}

// Problem descriptors for up to kChunk problems, passed by value as a kernel argument (20 KiB: one
// launch for a layer of up to 256 experts, where 4 KiB chunks took three for Qwen3's 128). Kernel
// arguments may take 32,764 bytes since CUDA 12.1 on Volta and later, which a CUDA 13 build implies.
constexpr int kChunk = 256;
constexpr size_t kMaxKernelArgBytes = 32764;
struct ProblemChunk {
  Problem p[kChunk];
  int count;
};
static_assert(sizeof(ProblemChunk) + 16 <= kMaxKernelArgBytes, "kernel arguments are limited to 32,764 bytes");

__global__ void write_problems(ProblemChunk chunk, Problem* dst) {
  const int i = static_cast<int>(threadIdx.x);
  if (i < chunk.count) dst[i] = chunk.p[i];
}

template <bool kTransA, bool kTransB, class TC, int kBN>
void launch(const Problem* problems, int count, int64_t tiles, int sm_count, float alpha, float beta, Stream s) {
  auto* kernel = grouped_gemm_sm90_kernel<kTransA, kTransB, TC, kBN>;
  constexpr size_t kSmemBytes = Shape<kBN>::kSmemBytes;
  allow_dynamic_smem<grouped_gemm_sm90_kernel<kTransA, kTransB, TC, kBN>>(kSmemBytes);
  const unsigned grid = unsigned(std::min<int64_t>(tiles, sm_count));
  kernel<<<grid, kThreads, kSmemBytes, s>>>(problems, count, alpha, beta);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool sm90_grouped_gemm_ready() { return flash::sm90_ready(); }

namespace {
// The four operand layouts and two C types of one tile width.
template <int kBN>
void launch_layout(const GemmArgs& g, const Problem* dev, int n, int64_t tiles, int sm_count, Stream s) {
  const bool f32 = g.c_type == GemmType::kF32;
  // trans_a / trans_b / C type: forward (false, true), input gradient (false, false), weight
  // gradient (true, false); (true, true) for completeness.
  if (!g.trans_a && g.trans_b) {
    f32 ? launch<false, true, float, kBN>(dev, n, tiles, sm_count, g.alpha, g.beta, s)
        : launch<false, true, bf16, kBN>(dev, n, tiles, sm_count, g.alpha, g.beta, s);
  } else if (!g.trans_a && !g.trans_b) {
    f32 ? launch<false, false, float, kBN>(dev, n, tiles, sm_count, g.alpha, g.beta, s)
        : launch<false, false, bf16, kBN>(dev, n, tiles, sm_count, g.alpha, g.beta, s);
  } else if (g.trans_a && !g.trans_b) {
    f32 ? launch<true, false, float, kBN>(dev, n, tiles, sm_count, g.alpha, g.beta, s)
        : launch<true, false, bf16, kBN>(dev, n, tiles, sm_count, g.alpha, g.beta, s);
  } else {
    f32 ? launch<true, true, float, kBN>(dev, n, tiles, sm_count, g.alpha, g.beta, s)
        : launch<true, true, bf16, kBN>(dev, n, tiles, sm_count, g.alpha, g.beta, s);
  }
}
}  // namespace

namespace {
// Writes the problems' descriptors to `pointers` (checked for the kernel first) and returns their
// output tiles.
int64_t write_problem_list(const std::vector<GemmArgs>& problems, void** pointers, Stream s,
                           const std::vector<GemmArgs>* second, int tile_n) {
  LOOM_CHECK(tile_n == 128 || tile_n == 256, "cuda grouped_gemm: the sm90 kernel's tiles are 128 or 256 wide, not ",
             tile_n);
  const char* why = second ? sm90_dual_unsupported(problems, *second) : sm90_grouped_unsupported(problems);
  LOOM_CHECK(why == nullptr, "cuda grouped_gemm: the sm90 kernel cannot run these problems: ", why);
  LOOM_CHECK(sm90_grouped_gemm_ready(), "cuda grouped_gemm: the sm90 kernel needs an sm_90 GPU and a build for sm_90a");
  LOOM_CHECK(pointers != nullptr && reinterpret_cast<uintptr_t>(pointers) % alignof(Problem) == 0,
             "cuda grouped_gemm: the problem list needs ", grouped_gemm_pointer_slots(problems.size()),
             " aligned device slots");
  const int n = static_cast<int>(problems.size());
  Problem* dev = reinterpret_cast<Problem*>(pointers);
  int64_t tiles = 0;
  for (int first = 0; first < n; first += kChunk) {
    ProblemChunk chunk{};
    chunk.count = std::min(kChunk, n - first);
    for (int i = 0; i < chunk.count; ++i) {
      const GemmArgs& g = problems[first + i];
      const GemmArgs& g2 = second ? (*second)[first + i] : g;
      const bool two = second != nullptr && g2.k > 0;
      chunk.p[i] = Problem{static_cast<const bf16*>(g.a), static_cast<const bf16*>(g.b), g.c,
                           static_cast<const bf16*>(two ? g2.a : g.a), static_cast<const bf16*>(two ? g2.b : g.b),
                           int32_t(g.m), int32_t(g.n), int32_t(g.k), int32_t(g.lda), int32_t(g.ldb), int32_t(g.ldc),
                           int32_t(two ? g2.k : 0), int32_t(two ? g2.lda : g.lda), int32_t(two ? g2.ldb : g.ldb), 0};
      tiles += ((g.m + kBM - 1) / kBM) * ((g.n + tile_n - 1) / tile_n);
    }
    write_problems<<<1, kChunk, 0, s>>>(chunk, dev + first);
    LOOM_CUDA_LAUNCH_CHECK();
  }
  return tiles;
}

}  // namespace

void sm90_grouped_gemm(const std::vector<GemmArgs>& problems, int sm_count, void** pointers, Stream s,
                       const std::vector<GemmArgs>* second, int tile_n) {
  if (problems.empty()) return;
  const int64_t tiles = write_problem_list(problems, pointers, s, second, tile_n);
  if (tiles == 0) return;
  if (sm_count <= 0) sm_count = cuda::sm_count();
  const int n = static_cast<int>(problems.size());
  const Problem* dev = reinterpret_cast<const Problem*>(pointers);
  if (tile_n == 256) launch_layout<256>(problems[0], dev, n, tiles, sm_count, s);
  else launch_layout<128>(problems[0], dev, n, tiles, sm_count, s);
}

}  // namespace loom::cuda
