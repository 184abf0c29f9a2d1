// Hopper (sm_90a) PTX wrappers for warp-specialised kernels: shared-memory mbarriers (init, arrive,
// arrive with an expected transaction count, parity wait), TMA tensor copies global -> shared that
// complete on an mbarrier, f32 reductions shared -> global (bulk ranges and tensor-map boxes),
// named barriers between warpgroups, and setmaxnreg. Host side: CUtensorMaps for [batch, seq,
// heads, head_dim] bf16 and f32 tensors, encoded through the driver entry point that the runtime
// hands out (no link against libcuda).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/flash_common.cuh"

namespace loom::cuda::tma {

using flash::smem_u32;

// ---- mbarriers (64-bit, in shared memory) ----
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes the initialisations visible to the other threads and to the async proxy (TMA); a
// __syncthreads() must follow before any other thread uses the barriers.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// One arrival that also announces `bytes` of transactions (TMA copies) the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
// Until the phase of parity `parity` has completed. A fresh barrier is in phase 0, so waiting for
// parity 1 returns at once (the "previous" phase counts as complete).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// ---- TMA ----
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// L2 eviction policies for the copies below that take one (createpolicy over all of an access's
// lines): data that other blocks read again soon (evict_last) or that no one reads again
// (evict_first). Made once per thread, before its loop of copies.
__device__ __forceinline__ uint64_t l2_evict_last() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// The box at coordinates (c0 innermost, c1, c2, c3) of a rank-4 tensor map into shared memory at
// dst; completes `box bytes` of transactions on bar. Out-of-range elements arrive as zeros.
__device__ __forceinline__ void copy_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                        int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// copy_4d with an L2 eviction policy (l2_evict_last, l2_evict_first) for the lines it reads.
__device__ __forceinline__ void copy_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                        int c3, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1, {%3, %4, %5, %6}], [%2], %7;\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(policy)
      : "memory");
}

// The box at (c0 innermost, c1, c2) of a rank-3 tensor map into dst, completing on bar, as copy_4d.
__device__ __forceinline__ void copy_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// copy_3d into the shared memory of every CTA of the cluster in cta_mask (bit r: rank r), at dst's
// offset in each, completing on the barrier at bar's offset in each.
__device__ __forceinline__ void copy_3d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                  int c2, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
      : "memory");
}

// ---- clusters ----
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_id() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_count() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
  return r;
}
// One arrival on the barrier at bar's offset in the shared memory of the cluster's CTA `rank` (default
// semantics: release at CTA scope, as CUTLASS's ClusterBarrier arrives; .release.cluster made ptxas put
// two fences, one GPU-wide, before each arrival). Enough where the arrival only says that this CTA's
// wgmmas have finished reading (wgmma.wait_group) what the other CTA's TMA will overwrite.
__device__ __forceinline__ void mbar_arrive_remote(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_u32(bar)),
      "r"(rank)
      : "memory");
}
// Every non-exited thread of the cluster's CTAs arrives, then waits for the others (release /
// acquire at cluster scope: barrier initialisations and shared-memory writes before it are seen after).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// ---- bulk reductions shared -> global (copy engine) ----
// Adds `bytes` of f32 at src (shared, 16-byte aligned) element-wise to dst (global, 16-byte
// aligned); bytes a multiple of 16.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(smem_u32(src)), "r"(bytes)
               : "memory");
}
// Adds the f32 box at src (shared, laid out as the map's swizzle says) element-wise to the box at
// coordinates (c0 innermost, c1, c2, c3) of a rank-4 f32 tensor map; elements out of range are
// skipped. Completes in this thread's bulk group, like bulk_reduce_add_f32.
__device__ __forceinline__ void reduce_add_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// reduce_add_4d with an L2 eviction policy for the lines it adds to.
__device__ __forceinline__ void reduce_add_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3,
                                              uint64_t policy) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group.L2::cache_hint [%0, {%2, %3, %4, %5}], [%1], "
      "%6;\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(policy)
      : "memory");
}
// The box at coordinates (c0 innermost, c1, c2, c3) of a rank-4 tensor map from shared memory at src
// (laid out as the map's swizzle says); elements out of range are not written. Completes in this
// thread's bulk group (bulk_wait_read before src is written again).
__device__ __forceinline__ void store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until this thread's bulk operations have read their shared-memory source (kRead) or completed.
template <bool kRead>
__device__ __forceinline__ void bulk_wait_all() {
  if constexpr (kRead) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  else asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Until at most kPending of this thread's newest bulk groups have not read their shared-memory source.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// ---- warpgroup coordination ----
// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads: sync waits for them all,
// arrive counts this thread and goes on.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Per-thread register budget of the executing warpgroup (every warp of it must run the same one).
template <int kRegs>
__device__ __forceinline__ void regs_dec() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void regs_inc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// ---- host ----
// Tensor map of a [batch, seq, heads, head_dim] bf16 tensor (rows of head_dim contiguous, 16-byte
// aligned, head_dim % 8 == 0) read in boxes of 64 columns (128 bytes, 128-byte swizzle: the layout
// of wgmma::sw128) x box_rows sequence positions of one head of one batch row. Coordinates are
// (column, head, position, batch); columns >= head_dim and positions >= seq read as zeros.
CUtensorMap make_bshd_map(const void* base, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int box_rows);
// The same for a [batch, seq, heads, head_dim] f32 tensor (head_dim % 4 == 0), in boxes of 32
// columns (128 bytes, 128-byte swizzle: element (r, c) of a box at float r * 32 + (((c >> 2) ^
// (r & 7)) << 2) + (c & 3)) x box_rows positions; for reductions into it (reduce_add_4d).
CUtensorMap make_bshd_map_f32(void* base, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int box_rows);

// Tensor map of `mats` bf16 matrices of `rows` rows of `cols` elements (row stride ld, matrix stride
// mat_stride, both in elements: ld % 8 == 0, 16-byte aligned base), read in boxes of box_cols (at most
// 64: 128 bytes, 128-byte swizzle) x box_rows of one matrix. Coordinates (column, row, matrix);
// columns >= cols and rows >= rows read as zeros.
CUtensorMap make_matrix_map(const void* base, int64_t cols, int64_t rows, int64_t ld, int64_t mats, int64_t mat_stride,
                            int box_cols, int box_rows);

}  // namespace loom::cuda::tma
