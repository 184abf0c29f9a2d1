// Flash attention forward on Hopper (sm_90a wgmma): one block of two warpgroups per (128 query
// rows, head, batch row), each warpgroup owning 64 rows. Q stays in shared memory as the A operand
// of S = Q K^T; P goes from the S accumulators straight into registers as the A operand of O += P V
// (no shared-memory round trip). K and V tiles of 128 keys (64 at head_dim 256) are double-buffered through cp.async into
// 128-byte-swizzled shared memory. Per key tile t the warpgroup runs the softmax of S(t) while the
// tensor cores finish O += P(t-1) V(t-1), then issues S(t+1) and O += P(t) V(t) back to back.
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/flash_mask.cuh"
#include "kernels/cuda/flash_sm90_pipeline.cuh"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace loom::cuda::flash {
namespace {

using wgmma::Wgmma;

constexpr int kWG = 2;  // warpgroups of 64 query rows per block (one block per SM)

template <int kD, int kBc>
constexpr size_t sm90_fwd_smem() {
  return size_t(64 * kWG + 4 * kBc) * kD * sizeof(bf16) + 1024;  // + slack to align the tiles to 1024 bytes
}

// One warpgroup per block and two blocks per SM (the former variant 4) was slower: 549 us against
// 425 at head_dim 128, b4 s2048 h32/8, H200, 2026-12-02.
template <int kD, int kBc>
__global__ void __launch_bounds__(128 * kWG, 1)
    flash_fwd_sm90_kernel(AttentionParams p, const bf16* __restrict__ q, const bf16* __restrict__ k,
                          const bf16* __restrict__ v, bf16* __restrict__ out, float* __restrict__ lse) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kBr = 64 * kWG, kThreads = 128 * kWG;
  constexpr int kNs = kBc / 8, kNo = kD / 8;  // 8-column groups of S and of O
  extern __shared__ unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
  bf16* sK0 = sQ + kBr * kD;
  bf16* sV0 = sK0 + 2 * kBc * kD;  // stage s of K / V at sK0 / sV0 + s * kBc * kD

  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, wg = wgmma::warpgroup();
  // Query tiles are the slowest grid dimension, last tile first: the longest causal rows of every
  // head start before any shorter ones.
  const int64_t q0 = int64_t(gridDim.z - 1 - blockIdx.z) * kBr;
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const HeadRows rows(p, q, k, v, b, h);

  const QueryTileKeys<kBr, kBc> keys(p, rows.seg, q0, lane);
  const int t_end = keys.t_end;
  auto next_tile = [&](int t, TileKind* kind) { return t < t_end ? keys.next(p, rows.seg, t, lane, kind) : t_end; };
  const wgmma::TileLoader<kBc, kD, kThreads> kv_loader(tid);
  auto load_k = [&](int t, int stage) {
    kv_loader.load(sK0 + stage * kBc * kD, rows.k, rows.kv_stride, int64_t(t) * kBc, p.seq, rows.hd);
  };
  auto load_v = [&](int t, int stage) {
    kv_loader.load(sV0 + stage * kBc * kD, rows.v, rows.kv_stride, int64_t(t) * kBc, p.seq, rows.hd);
  };
  // S = Q K^T for this warpgroup's 64 rows against the K tile in `stage` (issued, not waited for).
  float sacc[kBc / 2];
  auto issue_s = [&](int stage) {
    sm90::issue_qk<kD, kBr, kBc>(sacc, sQ, sK0 + stage * kBc * kD, 64 * wg);
  };

  // Prologue: Q and K(t0) (group 0); V(t0) and K(t1) (group 1); S(t0).
  TileKind kind = TileKind::kSkip, kind_n = TileKind::kSkip;
  int t = next_tile(int(keys.k_begin / kBc), &kind);
  wgmma::load_tile_sw128<kBr, kD, kThreads>(sQ, rows.q, rows.q_stride, q0, p.seq, rows.hd, tid);
  if (t < t_end) load_k(t, 0);
  flash::cp_async_commit();
  int tn = next_tile(t + 1, &kind_n);
  if (t < t_end) load_v(t, 0);
  if (tn < t_end) load_k(tn, 1);
  flash::cp_async_commit();
  flash::cp_async_wait<1>();
  wgmma::fence_proxy_async();
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kBc / 2; ++i) sacc[i] = 0.f;
  // Unconditional (a branch around it makes ptxas serialize every wgmma): with no visible tile, it
  // reads a stage nothing loaded and the loop below never uses the result.
  issue_s(0);
  wgmma::wait_regs<0>(sacc);

  const float scale_log2 = p.scale * kLog2e;
  const int64_t row0 = q0 + 64 * wg + 16 * (warp & 3) + (lane >> 2);  // this thread's rows: row0, row0 + 8
  const int col0 = 2 * (lane & 3);
  const bool causal_only = p.window <= 0 && rows.seg == nullptr;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float oacc[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) oacc[i] = 0.f;
  uint32_t pf[kBc / 16][4];
  int st = 0;  // stage of K(t) and V(t)

  while (t < t_end) {
    const int64_t k0 = int64_t(t) * kBc;
    // (a) Soft-cap, mask and online softmax of S(t), in place (log2 units), while O += P(t-1) V(t-1) runs.
    if (p.softcap > 0.f) {
#pragma unroll
      for (int i = 0; i < kBc / 2; ++i) {
        float dcap;
        sacc[i] = cap_dot(sacc[i], p.scale, p.softcap, &dcap);
      }
    }
    if (kind == TileKind::kMasked) {
      if (causal_only) {  // rows past seq are never written, and a valid row's j <= i < seq
        mask_causal<kNs>(sacc, int(row0 - k0) - col0);
      } else {  // window or documents: a bit per (row, column) first
        uint32_t bits[2];
        fragment_bits<kBc>(bits, col0, [&](int r, int col) { return rows.vis(row0 + 8 * r, k0 + col); });
        mask_bits<kNs>(sacc, bits);
      }
    }
    float corr[2];
    sm90::online_softmax<kNs>(sacc, m, l, corr, scale_log2);

    // (b) O += P(t-1) V(t-1) has finished: its registers (O, P) may be written again.
    wgmma::wait_regs<0>(oacc);
    sm90::pack_p<kNs>(pf, sacc);
    sm90::rescale_o<kNo>(oacc, corr);  // skipped by warps none of whose rows' maximum moved

    // (c) K(tn) and V(t) have landed, and every warp is done with K(t) and V(t-1).
    flash::cp_async_wait<0>();
    wgmma::fence_proxy_async();
    __syncthreads();
    // (d) Prefetch K(tnn) over K(t) and V(tn) over V(t-1).
    TileKind kind_nn = TileKind::kSkip;
    const int tnn = next_tile(tn + 1, &kind_nn);
    if (tnn < t_end) load_k(tnn, st);
    if (tn < t_end) load_v(tn, st ^ 1);
    flash::cp_async_commit();
    // (e) S(tn) = Q K(tn)^T, then (f) O += P(t) V(t): both in flight at once.
    if (tn < t_end) issue_s(st ^ 1);
    const uint64_t dv = wgmma::tile_desc(sV0 + st * kBc * kD, kBc * 128);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) Wgmma<kD>::template rs<1>(oacc, pf[kk], wgmma::desc_mn_major<kBc>(dv, kk), 1);
    wgmma::commit();
    // (g) S(tn) is ready (the older group; a no-op when there is none); O += P(t) V(t) may still run.
    wgmma::wait_regs<1>(sacc);
    t = tn;
    kind = kind_n;
    tn = tnn;
    kind_n = kind_nn;
    st ^= 1;
  }
  wgmma::wait_regs<0>(oacc);
  flash::cp_async_wait<0>();

  sm90::store_rows<kNo>(p, oacc, m, l, b, h, row0, col0, lane, out, lse);
#else
  __trap();  // built without sm_90a; forward_sm90 is never called then (sm90_ready())
#endif
}

template <int kD, int kBc>
void launch(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse, Stream s) {
  auto* kernel = flash_fwd_sm90_kernel<kD, kBc>;
  constexpr size_t kSmem = sm90_fwd_smem<kD, kBc>();
  constexpr int kBr = 64 * kWG;
  allow_dynamic_smem<flash_fwd_sm90_kernel<kD, kBc>>(kSmem);
  const dim3 grid(unsigned(p.heads), unsigned(p.batch), unsigned((p.seq + kBr - 1) / kBr));
  kernel<<<grid, 128 * kWG, kSmem, s>>>(p, q, k, v, out, lse);
  LOOM_CUDA_LAUNCH_CHECK();
}

// Writes 1 when this code was compiled for sm_90a (wgmma), 0 for any other target (such as an
// older target's PTX compiled by the driver at load time).
__global__ void sm90_probe_kernel(int* flag) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *flag = 1;
#else
  *flag = 0;
#endif
}

// Whether device dev is compute capability 9.0 and runs this binary's sm_90a code (a probe launch
// and a synchronous copy).
bool probe_sm90(int dev) {
  int major = 0, minor = 0;
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0) return false;
  int* flag = nullptr;
  int host = 0;
  LOOM_CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
  sm90_probe_kernel<<<1, 1>>>(flag);
  LOOM_CUDA_LAUNCH_CHECK();
  LOOM_CUDA_CHECK(cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost));
  LOOM_CUDA_CHECK(cudaFree(flag));
  return host == 1;
}

}  // namespace

// Asked once for each device: a process may drive GPUs of different kinds.
bool sm90_ready() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices];  // 0: not asked yet, 1: no, 2: yes
  int dev = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cacheable = dev >= 0 && dev < kMaxDevices;
  if (cacheable) {
    if (const int k = known[dev].load(std::memory_order_relaxed); k != 0) return k == 2;
  }
  const bool ready = probe_sm90(dev);
  if (cacheable) known[dev].store(ready ? 2 : 1, std::memory_order_relaxed);
  return ready;
}

void forward_sm90(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,
                  Stream s) {
  if (p.head_dim <= 64) {
    launch<64, 128>(p, q, k, v, out, lse, s);
  } else if (p.head_dim <= 128) {
    launch<128, 128>(p, q, k, v, out, lse, s);
  } else {
    // Key tiles of 64 at head_dim 256 (197 KB of shared memory, 254 registers, no spills): 400 us
    // against 535 with tiles of 32, b4 s2048 h16/8, H200, session 32 (flash_fwd/sm90/..._d256).
    launch<256, 64>(p, q, k, v, out, lse, s);
  }
}

}  // namespace loom::cuda::flash
