// The wgmma building blocks of the Hopper flash-attention kernels (kernels/cuda/wgmma.cuh) against
// a CPU matrix product, one warpgroup per case: swizzled tiles filled by cp.async, K-major and
// MN-major descriptors (two 64-column blocks each, and a block offset), A from shared memory or
// from registers, and the accumulator layout. Runs only on sm_90a (flash::sm90_ready()).
#include <gtest/gtest.h>

#include <vector>

#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

namespace wg = loom::cuda::wgmma;
using loom::cuda::wgmma::Wgmma;

constexpr int kM = 64, kT = 128;  // rows of every product; threads (one warpgroup)

__device__ bf16* aligned_smem(unsigned char* raw) {
  return reinterpret_cast<bf16*>(raw + ((1024 - (cuda::flash::smem_u32(raw) & 1023)) & 1023));
}

// Stores the m64nN accumulator to c [64][ldc] at column offset n0.
template <int kN>
__device__ void store_acc(const float (&d)[kN / 2], float* c, int ldc, int n0) {
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
#pragma unroll
  for (int n = 0; n < kN / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      c[(16 * warp + (lane >> 2) + 8 * (e >> 1)) * ldc + n0 + 8 * n + 2 * (lane & 3) + (e & 1)] = d[4 * n + e];
}

// c [64][kN] = a [64][kK] b[kN][kK]^T: both K-major (S = Q K^T in the forward).
template <int kN, int kK>
__global__ void ss_k_major_kernel(const bf16* a, const bf16* b, float* c) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char raw[];
  bf16* sa = aligned_smem(raw);
  bf16* sb = sa + kM * kK;
  const int tid = int(threadIdx.x);
  wg::load_tile_sw128<kM, kK, kT>(sa, a, kK, 0, kM, kK, tid);
  wg::load_tile_sw128<kN, kK, kT>(sb, b, kK, 0, kN, kK, tid);
  cuda::flash::cp_async_commit();
  cuda::flash::cp_async_wait<0>();
  wg::fence_proxy_async();
  __syncthreads();
  float d[kN / 2] = {};
  const uint64_t da = wg::tile_desc(sa, 16), db = wg::tile_desc(sb, 16);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    Wgmma<kN>::template ss<0, 0>(d, wg::desc_k_major<kM>(da, 0, kk), wg::desc_k_major<kN>(db, 0, kk), kk > 0);
  wg::commit();
  wg::wait<0>();
  wg::fence_regs(d);
  store_acc<kN>(d, c, kN, 0);
#endif
}

// c [64][kN] = a [64][kK] b [kK][kN]: A from registers, B N-major (O += P V in the forward).
template <int kN, int kK>
__global__ void rs_n_major_kernel(const bf16* a, const bf16* b, float* c) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char raw[];
  bf16* sb = aligned_smem(raw);
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  wg::load_tile_sw128<kK, kN, kT>(sb, b, kN, 0, kK, kN, tid);
  cuda::flash::cp_async_commit();
  // A fragments: rows r, r + 8; columns 16 kk + 2 t (+ 1), + 8.
  const int r = 16 * warp + (lane >> 2), t = lane & 3;
  auto pair = [&](int row, int col) {
    return *reinterpret_cast<const uint32_t*>(a + row * kK + col);
  };
  uint32_t af[kK / 16][4];
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    af[kk][0] = pair(r, 16 * kk + 2 * t);
    af[kk][1] = pair(r + 8, 16 * kk + 2 * t);
    af[kk][2] = pair(r, 16 * kk + 8 + 2 * t);
    af[kk][3] = pair(r + 8, 16 * kk + 8 + 2 * t);
  }
  cuda::flash::cp_async_wait<0>();
  wg::fence_proxy_async();
  __syncthreads();
  float d[kN / 2] = {};
  const uint64_t db = wg::tile_desc(sb, kK * 128);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) Wgmma<kN>::template rs<1>(d, af[kk], wg::desc_mn_major<kK>(db, kk), 1);
  wg::commit();
  wg::wait<0>();
  wg::fence_regs(d);
  store_acc<kN>(d, c, kN, 0);
#endif
}

// c [64][64] = at [kK][64]^T b [kK][128] over columns 64 .. 127 of b: A M-major, B N-major at a
// block offset (dQ = dS K in the backward).
template <int kK>
__global__ void ss_mn_major_kernel(const bf16* at, const bf16* b, float* c) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char raw[];
  bf16* sa = aligned_smem(raw);
  bf16* sb = sa + kK * 64;
  const int tid = int(threadIdx.x);
  wg::load_tile_sw128<kK, 64, kT>(sa, at, 64, 0, kK, 64, tid);
  wg::load_tile_sw128<kK, 128, kT>(sb, b, 128, 0, kK, 128, tid);
  cuda::flash::cp_async_commit();
  cuda::flash::cp_async_wait<0>();
  wg::fence_proxy_async();
  __syncthreads();
  float d[32] = {};
  const uint64_t da = wg::tile_desc(sa, kK * 128);
  const uint64_t db = wg::tile_desc(sb, kK * 128) + uint64_t((kK * 128) >> 4);  // second 64-column block
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    Wgmma<64>::template ss<1, 1>(d, wg::desc_mn_major<kK>(da, kk), wg::desc_mn_major<kK>(db, kk), kk > 0);
  wg::commit();
  wg::wait<0>();
  wg::fence_regs(d);
  store_acc<64>(d, c, 64, 0);
#endif
}

// c [m][n] = sum_k a(i, k) b(k, j) with the given element accessors, in double.
template <class FA, class FB>
std::vector<float> matmul(int m, int n, int k, FA a, FB b) {
  std::vector<float> c(size_t(m) * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int x = 0; x < k; ++x) s += double(a(i, x)) * double(b(x, j));
      c[size_t(i) * n + j] = float(s);
    }
  return c;
}

bool sm90() { return have_gpu() && cuda::flash::sm90_ready(); }

template <class K>
void launch(K kernel, size_t smem, const bf16* a, const bf16* b, float* c) {
  ASSERT_EQ(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)), cudaSuccess);
  kernel<<<1, kT, smem>>>(a, b, c);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// S = Q K^T's product (both K-major) for an N-row B over kK columns.
template <int kN, int kK>
void check_shared_k_major(uint32_t seed) {
  auto a = random_vec<bf16>(kM * kK, seed), b = random_vec<bf16>(kN * kK, seed + 1);
  auto ref = matmul(kM, kN, kK, [&](int i, int x) { return to_acc(a[i * kK + x]); },
                    [&](int x, int j) { return to_acc(b[j * kK + x]); });
  DeviceBuffer<bf16> da(a), db(b);
  DeviceBuffer<float> dc(ref.size());
  launch(ss_k_major_kernel<kN, kK>, size_t(kM + kN) * kK * 2 + 1024, da.get(), db.get(), dc.get());
  EXPECT_LT(rel_error(dc.to_host(), ref), 1e-5) << "n " << kN << " k " << kK;
}

// O += P V's product (A from registers, B N-major) for kN columns over kK rows of B.
template <int kN, int kK>
void check_registers_times_n_major(uint32_t seed) {
  auto a = random_vec<bf16>(kM * kK, seed), b = random_vec<bf16>(kK * kN, seed + 1);
  auto ref = matmul(kM, kN, kK, [&](int i, int x) { return to_acc(a[i * kK + x]); },
                    [&](int x, int j) { return to_acc(b[x * kN + j]); });
  DeviceBuffer<bf16> da(a), db(b);
  DeviceBuffer<float> dc(ref.size());
  launch(rs_n_major_kernel<kN, kK>, size_t(kK) * kN * 2 + 1024, da.get(), db.get(), dc.get());
  EXPECT_LT(rel_error(dc.to_host(), ref), 1e-5) << "n " << kN << " k " << kK;
}

TEST(WgmmaCuda, SharedKMajor) {
  if (!sm90()) GTEST_SKIP() << "needs sm_90a";
  check_shared_k_major<128, 128>(1);
  check_shared_k_major<80, 256>(11);  // the 256-wide forward's S: key tiles of 80 (column blocks 10 KB apart)
}

TEST(WgmmaCuda, RegistersTimesNMajor) {
  if (!sm90()) GTEST_SKIP() << "needs sm_90a";
  check_registers_times_n_major<128, 128>(3);
  check_registers_times_n_major<256, 80>(13);  // its O += P V: 80 keys, V's column blocks 10 KB apart
}

TEST(WgmmaCuda, SharedMMajorTimesNMajorAtBlockOffset) {
  if (!sm90()) GTEST_SKIP() << "needs sm_90a";
  constexpr int kK = 128;
  auto at = random_vec<bf16>(kK * 64, 5), b = random_vec<bf16>(kK * 128, 6);
  auto ref = matmul(kM, 64, kK, [&](int i, int x) { return to_acc(at[x * 64 + i]); },
                    [&](int x, int j) { return to_acc(b[x * 128 + 64 + j]); });
  DeviceBuffer<bf16> da(at), db(b);
  DeviceBuffer<float> dc(ref.size());
  launch(ss_mn_major_kernel<kK>, size_t(kK) * (64 + 128) * 2 + 1024, da.get(), db.get(), dc.get());
  EXPECT_LT(rel_error(dc.to_host(), ref), 1e-5);
}

}  // namespace
}  // namespace loom::test
