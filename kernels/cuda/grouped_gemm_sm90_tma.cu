// The TMA-fed Hopper grouped GEMM (kernels/grouped_gemm_tma.h): a mixture-of-experts layer's
// row-grouped products, C[rows_e] = alpha (A[rows_e] op(B[e]) (+ A2[rows_e] op(B2[e]))) + beta C[rows_e].
//
// Why: the cp.async kernel (grouped_gemm_sm90.cu) has its 256 threads both load and multiply, with a
// block-wide barrier every k-step, and every block reads its own 48 KiB of operands from L2 a k-step
// for 2 M multiply-adds: Qwen3-30B-A3B's expert products ran at 45-57 % of the GEMM rate (H200,
// session 33). cuBLAS's dense kernels in the same profiles are nvjet 256 x 128 tiles in clusters of
// two (by their names), which share operand tiles between the pair; by my arithmetic 48 KiB a k-step
// at the full rate asks more of L2 than it gives (to be confirmed: tools/gpu/gpu_grouped_check.sh PROFILE=1).
//
// Work: a unit is one expert's 128-row tile (two adjacent ones with clusters of two, one a CTA) by a
// 256-column tile; units are numbered expert by expert (M fastest, then N), their starts per expert
// passed as launch arguments. Clusters walk units cluster, cluster + clusters, ... (persistent).
// Rows of a tile past its expert's end belong to the next expert (or are past A: zeros): they are
// multiplied and never stored.
// Block = 3 warpgroups (384 threads):
//   warpgroup 0: setmaxnreg down to 40. Thread 0 is the producer: per k-step it waits for the stage to
//     be free (empty), announces the stage's bytes (full) and issues the TMA copies: A's 128 x 64 tile
//     (its own), and its part of B's tile (all of it alone; half with a cluster of two, multicast to
//     both CTAs). The other threads leave.
//   warpgroups 1 and 2, consumers: setmaxnreg up to 232; rows 64 c .. 64 c + 63 of the tile
//     (m64n256k16 wgmma, 128 f32 accumulators a thread), then the epilogue straight to global memory
//     (kernels/cuda/grouped_gemm_store.cuh).
// Shared memory: kStages = 4 stages of A 16 KiB + B 32 KiB (both 128-byte swizzled: wgmma::sw128's
// layout, which TMA's 128-byte swizzle writes): 192 KiB + 1 KiB alignment slack.
// Operand layouts (tensor maps of whole tensors, make_matrix_map):
//   A [N, K] (row stride lda), boxes of 64 columns x 128 rows at (k0, first row of the tile).
//   B forward (kTransB: W [E, m, K], B = W_e^T, K-major): boxes of 64 x 256 (128 with a cluster) rows of
//     W_e at (k0, n0 (+ 128 rank), e): the tile's rows are its output columns.
//   B input gradient (W [E, K, m], B = W_e as [K, m], MN-major): four 64-column blocks of 64 K-rows,
//     boxes of 64 x 64 at (n0 + 64 j, k0, e) (blocks 2 rank, 2 rank + 1 with a cluster).
//   A2, B2 (the LoRA term): the same with their own K (the rank, 16: one k-step whose columns past the
//     rank arrive as zeros), after the first product's k-steps, into the same accumulators.
// Barrier protocol (k-step n of the CTA counts every unit's k-steps; stage n % kStages, phase parity
// (n / kStages) & 1):
//   full[s] (count 1): the producer's arrive.expect_tx of the stage's 48 KiB (its A, its B part and,
//     with a cluster, the other CTA's multicast B part); TMA completes the bytes.
//     Another CTA's multicast can complete bytes before this CTA's producer announces them: the phase
//     cannot end before its arrivals.
//   empty[s] (count 8 x cluster: each consumer warp of every CTA of the cluster): a warp arrives on the
//     stage's barrier in every CTA of the cluster (their producers write into this CTA too) once its
//     wgmmas that read the stage completed. The producer waits with the opposite parity, so its first
//     pass through the ring does not wait.
//   The cluster synchronises after the barriers are initialised and before any CTA leaves (arrivals
//   and multicast copies target the other CTA's shared memory).
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/grouped_gemm_store.cuh"
#include "kernels/cuda/tma_mbarrier.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/grouped_gemm_tma.h"

namespace loom::cuda {
namespace {

using wgmma::Wgmma;

constexpr int kBM = 128, kBN = 256, kBK = 64, kThreads = 384, kStages = 4;
constexpr int kAElems = kBM * kBK, kBElems = kBN * kBK, kStageElems = kAElems + kBElems;
constexpr uint32_t kStageBytes = uint32_t(kStageElems * sizeof(bf16));  // 48 KiB
constexpr size_t kSmemBytes = size_t(kStages) * kStageElems * sizeof(bf16) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "Hopper gives a block at most 227 KiB of shared memory");
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128 x 40 + 256 x 232 <= 64 K registers
constexpr int kOldGroups = 8;                           // the epilogue's old-value loads (a quarter of 256 columns)

// The launch's expert table: rows [row_start[e], row_start[e + 1]) are expert e's, its units
// [unit_start[e], unit_start[e + 1]).
constexpr int kMaxExperts = int(kSm90TmaMaxExperts);
struct Groups {
  int32_t row_start[kMaxExperts + 1];
  int32_t unit_start[kMaxExperts + 1];
  int32_t experts, n, k, k_steps, k2_steps;  // n: the output's columns, k: A B's depth; k-steps of A B and of A2 B2
};

static_assert(sizeof(Groups) + 4 * sizeof(CUtensorMap) + 64 <= 32764,
              "launch arguments: at most 32,764 bytes (CUDA 12.1 and later)");

// Unit u of this CTA (rank in its cluster): its expert, the tile's first row in A and C, the
// expert's end row, and the tile's first column.
struct Unit {
  int e, row0, rows_end, n0;
};
template <int kCluster>
__device__ __forceinline__ Unit unit_of(const Groups& g, int u, int rank) {
  int lo = 0, hi = g.experts - 1;  // the last expert whose units start at or before u (it owns u)
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (g.unit_start[mid] <= u) lo = mid;
    else hi = mid - 1;
  }
  const int rows = g.row_start[lo + 1] - g.row_start[lo];
  const int groups = ((rows + kBM - 1) / kBM + kCluster - 1) / kCluster;  // M-tile groups of the expert
  const int local = u - g.unit_start[lo];
  Unit t;
  t.e = lo;
  t.row0 = g.row_start[lo] + ((local % groups) * kCluster + rank) * kBM;
  t.rows_end = g.row_start[lo + 1];
  t.n0 = (local / groups) * kBN;
  return t;
}

// Issues k-step kt of unit t into stage (sA, sB) on bar: A's tile, this CTA's part of B's.
template <bool kTransB, int kCluster>
__device__ __forceinline__ void issue_step(const CUtensorMap* map_a, const CUtensorMap* map_b,
                                           const CUtensorMap* map_a2, const CUtensorMap* map_b2, const Groups& g,
                                           const Unit& t, int kt, int rank, bf16* sA, bf16* sB, uint64_t* bar) {
  const bool first = kt < g.k_steps;
  const CUtensorMap* ma = first ? map_a : map_a2;
  const CUtensorMap* mb = first ? map_b : map_b2;
  const int k0 = (first ? kt : kt - g.k_steps) * kBK;
  tma::copy_3d(sA, ma, bar, k0, t.row0, 0);
  if constexpr (kTransB) {  // rows (output columns) of W_e: all 256, or this rank's 128
    constexpr int kRows = kBN / kCluster;
    bf16* dst = sB + rank * kRows * kBK;
    if constexpr (kCluster == 1) tma::copy_3d(dst, mb, bar, k0, t.n0, t.e);
    else tma::copy_3d_multicast(dst, mb, bar, k0, t.n0 + rank * kRows, t.e, uint16_t((1u << kCluster) - 1));
  } else {  // 64-column blocks of W_e's k0 .. k0 + 63 rows: all four, or this rank's two
    constexpr int kBlocks = (kBN / 64) / kCluster;
#pragma unroll
    for (int j = rank * kBlocks; j < (rank + 1) * kBlocks; ++j) {
      bf16* dst = sB + j * 64 * kBK;
      if constexpr (kCluster == 1) tma::copy_3d(dst, mb, bar, t.n0 + 64 * j, k0, t.e);
      else tma::copy_3d_multicast(dst, mb, bar, t.n0 + 64 * j, k0, t.e, uint16_t((1u << kCluster) - 1));
    }
  }
}

// The stage's release by this consumer warp: one arrival on its empty barrier in every CTA of the cluster.
template <int kCluster>
__device__ __forceinline__ void release(uint64_t* empty, int lane, int rank) {
  if (lane == 0) {
    tma::mbar_arrive(empty);  // this CTA's own
#pragma unroll
    for (int r = 0; r < kCluster; ++r)
      if (r != rank) tma::mbar_arrive_remote(empty, uint32_t(r));
  }
}

// The producer's walk over its CTA's k-steps (every unit's, in the consumers' order) and the ring
// stage each one fills.
template <int kCluster>
struct StepCursor {
  int u, kt, stage;
  uint32_t phase;
  Unit t;
  __device__ __forceinline__ void start(const Groups& g, int first, int rank, int units) {
    u = first, kt = 0, stage = 0, phase = 0;
    if (u < units) t = unit_of<kCluster>(g, u, rank);
  }
  __device__ __forceinline__ void advance(const Groups& g, int clusters, int rank, int units, int steps) {
    if (++stage == kStages) stage = 0, phase ^= 1u;
    if (++kt == steps) {
      kt = 0, u += clusters;
      if (u < units) t = unit_of<kCluster>(g, u, rank);
    }
  }
};

template <bool kTransB, class TC, int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_sm90_tma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                                 const __grid_constant__ CUtensorMap map_a2, const __grid_constant__ CUtensorMap map_b2,
                                 const __grid_constant__ Groups g, TC* __restrict__ c, int64_t ldc, float alpha,
                                 float beta) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[2 * kStages];
  uint64_t* full = bars;
  uint64_t* empty = bars + kStages;
  bf16* smem = reinterpret_cast<bf16*>(smem_raw + ((1024 - (flash::smem_u32(smem_raw) & 1023)) & 1023));
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, wg = wgmma::warpgroup();
  const int rank = kCluster == 1 ? 0 : int(tma::cluster_rank());
  const int cluster = kCluster == 1 ? int(blockIdx.x) : int(tma::cluster_id());
  const int clusters = kCluster == 1 ? int(gridDim.x) : int(tma::cluster_count());
  const int units = g.unit_start[g.experts];
  const int steps = g.k_steps + g.k2_steps;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      tma::mbar_init(&full[s], 1);
      tma::mbar_init(&empty[s], 8 * kCluster);
    }
    tma::mbar_init_fence();
  }
  if constexpr (kCluster == 1) __syncthreads();
  else tma::cluster_sync();  // the other CTA's barriers exist before anything arrives on them

  if (wg == 0) {
    tma::regs_dec<kProducerRegs>();
    if (tid == 0) {  // ---- producer thread ----
      tma::prefetch_tensormap(&map_a);
      tma::prefetch_tensormap(&map_b);
      tma::prefetch_tensormap(&map_a2);
      tma::prefetch_tensormap(&map_b2);
      StepCursor<kCluster> at;
      for (at.start(g, cluster, rank, units); at.u < units; at.advance(g, clusters, rank, units, steps)) {
        tma::mbar_wait(&empty[at.stage], at.phase ^ 1u);
        tma::mbar_arrive_expect_tx(&full[at.stage], kStageBytes);
        bf16* sA = smem + at.stage * kStageElems;
        issue_step<kTransB, kCluster>(&map_a, &map_b, &map_a2, &map_b2, g, at.t, at.kt, rank, sA, sA + kAElems,
                                      &full[at.stage]);
      }
    }
    if constexpr (kCluster > 1) {
      if (tid == 0) tma::cluster_sync();  // stays until the other CTA is done with this one's memory
    }
    return;
  }

  // ---- consumers: rows 64 cw .. 64 cw + 63 of each tile ----
  tma::regs_inc<kConsumerRegs>();
  const int cw = wg - 1;
  int stage = 0;
  uint32_t phase = 0;
  for (int u = cluster; u < units; u += clusters) {
    const Unit t = unit_of<kCluster>(g, u, rank);
    float acc[kBN / 2];
#pragma unroll
    for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.f;
    int prev = -1;  // the stage the previous k-step's wgmmas read, released once they complete
    for (int kt = 0; kt < steps; ++kt) {
      tma::mbar_wait(&full[stage], phase);
      const bf16* sA = smem + stage * kStageElems;
      const bf16* sB = sA + kAElems;
      const uint64_t da = wgmma::tile_desc(sA, 16);
      const uint64_t db = kTransB ? wgmma::tile_desc(sB, 16) : wgmma::tile_desc(sB, kBK * 128);  // 64-column blocks
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        const uint64_t a = wgmma::desc_k_major<kBM>(da, 64 * cw, kk);
        const uint64_t b = kTransB ? wgmma::desc_k_major<kBN>(db, 0, kk) : wgmma::desc_mn_major<kBK>(db, kk);
        Wgmma<kBN>::template ss<0, kTransB ? 0 : 1>(acc, a, b, (kt == 0 && kk == 0) ? 0 : 1);
      }
      wgmma::commit();
      wgmma::wait<1>();  // the previous k-step's wgmmas are done: its stage may be refilled
      if (prev >= 0) release<kCluster>(&empty[prev], lane, rank);
      prev = stage;
      if (++stage == kStages) stage = 0, phase ^= 1u;
    }
    wgmma::wait<0>();
    wgmma::fence_regs(acc);
    release<kCluster>(&empty[prev], lane, rank);
    const int rows = t.rows_end - t.row0;  // this tile's rows of its expert (none for a cluster's extra tile)
    grouped::store_acc<TC, kBN, kOldGroups>(c + int64_t(t.row0) * ldc, ldc, 64 * cw + 16 * (warp & 3) + (lane >> 2),
                                            rows, t.n0 + 2 * (lane & 3), g.n, acc, alpha, beta);
  }
  if constexpr (kCluster > 1) tma::cluster_sync();
#else
  __trap();  // built without sm_90a: sm90_grouped_gemm_tma never launches it then (sm90_grouped_gemm_ready())
#endif
}

template <bool kTransB, class TC, int kCluster>
void launch(const CUtensorMap& ma, const CUtensorMap& mb, const CUtensorMap& ma2, const CUtensorMap& mb2,
            const Groups& g, void* c, int64_t ldc, float alpha, float beta, int sm_count, Stream s) {
  auto* kernel = grouped_gemm_sm90_tma_kernel<kTransB, TC, kCluster>;
  allow_dynamic_smem<grouped_gemm_sm90_tma_kernel<kTransB, TC, kCluster>>(kSmemBytes);
  const int units = g.unit_start[g.experts];
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(kCluster), attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = s;
  int clusters = sm_count / kCluster;
  if constexpr (kCluster > 1) {  // as many clusters as can be resident at once (SMs pair up within a GPC)
    static std::atomic<int> resident_by_device[16];  // 0: not asked yet (asked once a device and kernel)
    int device = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&device));
    int resident = device < 16 ? resident_by_device[device].load(std::memory_order_relaxed) : 0;
    if (resident == 0) {
      cfg.gridDim = dim3(unsigned(clusters * kCluster));
      cfg.attrs = attr, cfg.numAttrs = 1;
      LOOM_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&resident, kernel, &cfg));
      if (device < 16 && resident > 0) resident_by_device[device].store(resident, std::memory_order_relaxed);
    }
    if (resident > 0) clusters = std::min(clusters, resident);
  }
  clusters = std::max(1, std::min(clusters, units));
  cfg.gridDim = dim3(unsigned(clusters * kCluster));
  cfg.attrs = kCluster > 1 ? attr : nullptr, cfg.numAttrs = kCluster > 1 ? 1 : 0;
  LOOM_CUDA_CHECK(
      cudaLaunchKernelEx(&cfg, kernel, ma, mb, ma2, mb2, g, static_cast<TC*>(c), ldc, alpha, beta));
  LOOM_CUDA_LAUNCH_CHECK();
}

// The tensor map of one product's B: W [E, m, k] (forward, boxes of 256 / cluster rows) or [E, k, m]
// (input gradient, boxes of 64 x 64).
CUtensorMap b_map(const RowGroupedGemm& g, int64_t experts, int cluster) {
  if (g.trans_b) return tma::make_matrix_map(g.b, g.k, g.m, g.k, experts, g.m * g.k, kBK, kBN / cluster);
  return tma::make_matrix_map(g.b, g.m, g.k, g.m, experts, g.k * g.m, 64, kBK);
}

}  // namespace

namespace {

// The launch's expert table and tensor maps.
struct Prepared {
  Groups g{};
  CUtensorMap ma, mb, ma2, mb2;
  int64_t units = 0;
};
Prepared prepare(const RowGroupedGemm& g, const RowGroupedGemm* second, const std::vector<int64_t>& offsets,
                 int cluster) {
  LOOM_CHECK(flash::sm90_ready(), "cuda grouped_gemm (TMA): needs an sm_90 GPU and a build for sm_90a");
  const int64_t experts = int64_t(offsets.size()) - 1, rows = offsets.back();
  Prepared p;
  p.g.experts = int32_t(experts);
  p.g.n = int32_t(g.m);
  p.g.k = int32_t(g.k);
  p.g.k_steps = int32_t((g.k + kBK - 1) / kBK);
  p.g.k2_steps = second ? int32_t((second->k + kBK - 1) / kBK) : 0;
  const int64_t n_tiles = (g.m + kBN - 1) / kBN;
  for (int64_t e = 0; e <= experts; ++e) {
    p.g.row_start[e] = int32_t(offsets[size_t(e)]);
    p.g.unit_start[e] = int32_t(p.units);
    if (e == experts) break;
    const int64_t m_tiles = (offsets[size_t(e) + 1] - offsets[size_t(e)] + kBM - 1) / kBM;
    p.units += (m_tiles + cluster - 1) / cluster * n_tiles;
  }
  LOOM_CHECK(p.units < (int64_t(1) << 31), "cuda grouped_gemm (TMA): ", p.units, " work units");
  if (p.units == 0) return p;
  p.ma = tma::make_matrix_map(g.a, g.k, rows, g.lda, 1, rows * g.lda, kBK, kBM);
  // Maps of a product that does not run repeat one that does (never read: no k-steps of theirs).
  p.ma2 = second ? tma::make_matrix_map(second->a, second->k, rows, second->lda, 1, rows * second->lda, kBK, kBM) : p.ma;
  p.mb2 = second ? b_map(*second, experts, cluster) : p.ma;
  p.mb = b_map(g, experts, cluster);
  return p;
}

void run(const RowGroupedGemm& g, const Prepared& p, int cluster, int sm_count, Stream s) {
  if (sm_count <= 0) sm_count = cuda::sm_count();
  const bool f32 = g.c_type == GemmType::kF32;
  auto go = [&](auto trans_b, auto two) {
    constexpr bool kT = decltype(trans_b)::value;
    constexpr int kC = decltype(two)::value;
    f32 ? launch<kT, float, kC>(p.ma, p.mb, p.ma2, p.mb2, p.g, g.c, g.m, g.alpha, g.beta, sm_count, s)
        : launch<kT, bf16, kC>(p.ma, p.mb, p.ma2, p.mb2, p.g, g.c, g.m, g.alpha, g.beta, sm_count, s);
  };
  using T = std::true_type;
  using F = std::false_type;
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  if (g.trans_b) cluster == 2 ? go(T{}, Two{}) : go(T{}, One{});
  else cluster == 2 ? go(F{}, Two{}) : go(F{}, One{});
}

}  // namespace

void sm90_grouped_gemm_tma(const RowGroupedGemm& g, const RowGroupedGemm* second, const std::vector<int64_t>& offsets,
                           int cluster, int sm_count, Stream s) {
  const char* why = sm90_tma_unsupported(g, second, offsets);
  LOOM_CHECK(why == nullptr, "cuda grouped_gemm (TMA): the sm90 kernel cannot run these products: ", why);
  LOOM_CHECK(cluster == 1 || cluster == 2, "cuda grouped_gemm (TMA): clusters of 1 or 2 CTAs, not ", cluster);
  const Prepared p = prepare(g, second, offsets, cluster);
  if (p.units > 0) run(g, p, cluster, sm_count, s);
}

}  // namespace loom::cuda
