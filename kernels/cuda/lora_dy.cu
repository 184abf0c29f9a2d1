// CUDA kernel for kernels/lora_dy.h: dt = dy b and db = dy^T t from one read of dy, on tensor cores
// (mma.sync m16n8k16, f32 accumulation; the tile loads and fragments of flash_common.cuh).
//
// Block = 8 warps over a strip of dy: rows [row_begin, row_begin + rs) x columns [col0, col0 + kCs),
// read as tiles of 128 rows x 64 columns (cp.async, kStages deep), row chunk by row chunk and within
// each the strip's kCc column chunks in turn. b's rows of the strip stay in shared memory for the
// whole block, t's rows of the current chunk beside them (kNp = m r rounded up to 16 columns).
//   dt: warp w takes the tile's rows 16 w .. 16 w + 15 against b's 64 rows of the chunk (K = columns)
//       and keeps [16, kNp] in registers over the strip's columns; at the end of a row chunk it is
//       one partial of dt, per column strip: part_dt [col strips, n, kNp].
//   db: warp w takes the tile's columns 16 (w % 4) .. + 15 (dy^T from ldmatrix.trans) against t's
//       columns of half w / 4 (K = the 128 rows) and keeps, for each column chunk of the strip, its
//       [16, kNp / 2] in registers over all of the block's rows (kCs kNp / 256 = 64 floats a
//       thread at every kNp): one partial of db per row strip, part_db [row strips, out, kNp].
// The strip sizes give about one block per SM (one wave; dy streams once); reduce_kernel then adds
// the partials and the m column blocks in a fixed order: the result does not depend on timing.
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/flash_common.cuh"
#include "kernels/lora_dy.h"

namespace loom::cuda {
namespace {

using flash::cp_async16;
using flash::FragLane;

constexpr int kTm = 128, kTk = 64, kThreads = 256, kStages = 4;

template <int kNp>
struct Cfg {
  static constexpr int kCs = 16384 / kNp;  // dy columns a block takes: kCc chunks of 64
  static constexpr int kCc = kCs / kTk;
  static constexpr int kPitch = kNp + 8;  // b's and t's rows in shared memory: 8 rows an ldmatrix reads hit 8 bank groups
  // t's buffers: a row chunk's t is loaded with its first tile, kStages - 1 tiles ahead; two buffers
  // do when a chunk has at least that many tiles.
  static constexpr int kTBufs = kCc >= kStages - 1 ? 2 : 3;
  static constexpr size_t kDyBytes = size_t(kStages) * kTm * kTk * 2;
  static constexpr size_t kTBytes = size_t(kTBufs) * kTm * kPitch * 2;
  static constexpr size_t kBBytes = size_t(kCs) * kPitch * 2;
  static constexpr size_t kSmem = kDyBytes + kTBytes + kBBytes;
};

// Rows [row0, row0 + rows) of a [*, ld] bf16 matrix, its first `cols` columns (a multiple of 8), into
// a kNp-wide tile of pitch kNp + 8; rows past row_end and columns past cols are zeros.
template <int kNp>
__device__ __forceinline__ void load_narrow(bf16* dst, const bf16* src, int64_t ld, int64_t row0, int rows,
                                            int64_t row_end, int cols) {
  constexpr int kChunks = kNp / 8;
  for (int i = threadIdx.x; i < rows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const bool ok = row0 + r < row_end && c < cols;
    cp_async16(dst + r * (kNp + 8) + c, ok ? src + (row0 + r) * ld + c : src, ok);
  }
}

// Two adjacent 8-wide N tiles of B from a tile whose rows are K and columns N (pitch kPitch), at
// (k0, n0): b[0], b[1] for n0, b[2], b[3] for n0 + 8.
template <int kPitch>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const bf16* tile, int k0, int n0, int lane) {
  flash::ldsm_x4_t(b, tile + (k0 + (lane & 15)) * kPitch + n0 + ((lane >> 4) << 3));
}

template <int kNp>
__global__ void __launch_bounds__(kThreads, 1)
    lora_dy_kernel(const bf16* __restrict__ dy, int64_t ld_dy, const bf16* __restrict__ b, int64_t ld_b,
                   const bf16* __restrict__ t, int64_t ld_t, int64_t n, int64_t out, int mr, int64_t rs,
                   float* __restrict__ part_dt, float* __restrict__ part_db) {
  using C = Cfg<kNp>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* dys = reinterpret_cast<bf16*>(smem);
  bf16* ts = reinterpret_cast<bf16*>(smem + C::kDyBytes);
  bf16* bs = reinterpret_cast<bf16*>(smem + C::kDyBytes + C::kTBytes);
  const int64_t col0 = int64_t(blockIdx.x) * C::kCs, row_begin = int64_t(blockIdx.y) * rs;
  const int64_t row_end = min(n, row_begin + rs);
  const int chunks = int((row_end - row_begin + kTm - 1) / kTm), tiles = chunks * C::kCc;
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;

  // Tile q's loads (row chunk q / kCc, column chunk q % kCc), with its chunk's t rows at the first
  // column chunk and the strip's b rows with tile 0; one commit group a tile, empty past the last.
  auto issue = [&](int q) {
    if (q < tiles) {
      const int mi = q / C::kCc, ci = q % C::kCc;
      const int64_t r0 = row_begin + int64_t(mi) * kTm, c = col0 + int64_t(ci) * kTk;
      const int cols = out - c >= kTk ? kTk : out > c ? int(out - c) : 0;
      flash::load_tile<kTm, kTk, kThreads>(dys + (q % kStages) * kTm * kTk, dy + min(c, out), ld_dy, r0, row_end, cols);
      if (ci == 0) load_narrow<kNp>(ts + (mi % C::kTBufs) * kTm * C::kPitch, t, ld_t, r0, kTm, row_end, mr);
      if (q == 0) load_narrow<kNp>(bs, b, ld_b, col0, C::kCs, out, mr);
    }
    flash::cp_async_commit();
  };
  for (int q = 0; q < kStages - 1; ++q) issue(q);

  constexpr int kDbTiles = kNp / 16;  // 8-wide N tiles of a warp's half of db's columns
  float db_acc[C::kCc][kDbTiles][4];
#pragma unroll
  for (int ci = 0; ci < C::kCc; ++ci)
#pragma unroll
    for (int j = 0; j < kDbTiles; ++j) db_acc[ci][j][0] = db_acc[ci][j][1] = db_acc[ci][j][2] = db_acc[ci][j][3] = 0.f;
  const FragLane fa = flash::frag_rows16(lane), fat = flash::frag_rows8x2(lane);
  const int mt = warp & 3, nh = warp >> 2;

  for (int mi = 0; mi < chunks; ++mi) {
    float dt_acc[kNp / 8][4];
#pragma unroll
    for (int j = 0; j < kNp / 8; ++j) dt_acc[j][0] = dt_acc[j][1] = dt_acc[j][2] = dt_acc[j][3] = 0.f;
    const bf16* tt = ts + (mi % C::kTBufs) * kTm * C::kPitch;
#pragma unroll
    for (int ci = 0; ci < C::kCc; ++ci) {
      const int q = mi * C::kCc + ci;
      flash::cp_async_wait<kStages - 2>();
      __syncthreads();      // tile q landed for every thread; tile q - 1's stage is free
      issue(q + kStages - 1);  // into that stage
      const bf16* tile = dys + (q % kStages) * kTm * kTk;
      // dt[rows 16 w..] += tile[rows 16 w.., 64 columns] b[the chunk's 64 rows, kNp]
#pragma unroll
      for (int kk = 0; kk < kTk / 16; ++kk) {
        uint32_t a[4];
        flash::load_a<kTk>(a, tile, warp * 16, kk * 16, fa);
#pragma unroll
        for (int nn = 0; nn < kNp / 16; ++nn) {
          uint32_t bb[4];
          load_b_kn<C::kPitch>(bb, bs, ci * kTk + kk * 16, nn * 16, lane);
          flash::mma16816(dt_acc[2 * nn], a, bb[0], bb[1]);
          flash::mma16816(dt_acc[2 * nn + 1], a, bb[2], bb[3]);
        }
      }
      // db[the chunk's columns 16 mt.., half nh] += tile^T[16 columns, 128 rows] t[128 rows, half nh]
#pragma unroll
      for (int kk = 0; kk < kTm / 16; ++kk) {
        uint32_t a[4];
        flash::load_a_t<kTk>(a, tile, kk * 16, mt * 16, fat);
#pragma unroll
        for (int nn = 0; nn < (kDbTiles + 1) / 2; ++nn) {
          uint32_t bb[4];
          load_b_kn<C::kPitch>(bb, tt, kk * 16, nh * (kNp / 2) + nn * 16, lane);
          flash::mma16816(db_acc[ci][2 * nn], a, bb[0], bb[1]);
          if (2 * nn + 1 < kDbTiles) flash::mma16816(db_acc[ci][2 * nn + 1], a, bb[2], bb[3]);
        }
      }
    }
    // This row chunk's dt over the strip's columns: one partial per column strip.
    const int64_t row = row_begin + int64_t(mi) * kTm + warp * 16 + (lane >> 2);
    float* pd = part_dt + (int64_t(blockIdx.x) * n) * kNp + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < kNp / 8; ++j) {
      if (row < row_end) *reinterpret_cast<float2*>(pd + row * kNp + j * 8) = make_float2(dt_acc[j][0], dt_acc[j][1]);
      if (row + 8 < row_end)
        *reinterpret_cast<float2*>(pd + (row + 8) * kNp + j * 8) = make_float2(dt_acc[j][2], dt_acc[j][3]);
    }
  }
  // db over the block's rows: one partial per row strip.
  float* pb = part_db + (int64_t(blockIdx.y) * out) * kNp + nh * (kNp / 2) + 2 * (lane & 3);
#pragma unroll
  for (int ci = 0; ci < C::kCc; ++ci) {
    const int64_t o = col0 + ci * kTk + mt * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < kDbTiles; ++j) {
      if (o < out) *reinterpret_cast<float2*>(pb + o * kNp + j * 8) = make_float2(db_acc[ci][j][0], db_acc[ci][j][1]);
      if (o + 8 < out)
        *reinterpret_cast<float2*>(pb + (o + 8) * kNp + j * 8) = make_float2(db_acc[ci][j][2], db_acc[ci][j][3]);
    }
  }
}

// out[i, j] = alpha * sum over the partials s and the column blocks p of part[s][i][p r + j].
__global__ void reduce_kernel(const float* __restrict__ part, int parts, int64_t rows, int np, int64_t r, int m,
                              float alpha, float* __restrict__ out) {
  const int64_t total = rows * r;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / r, j = i % r;
    float s = 0.f;
    for (int q = 0; q < parts; ++q)
      for (int p = 0; p < m; ++p) s += part[(q * rows + row) * np + p * r + j];
    out[i] = alpha * s;
  }
}

int padded_width(int64_t mr) { return mr <= 16 ? 16 : mr <= 32 ? 32 : mr <= 64 ? 64 : 128; }

int columns_per_block(int np) { return 16384 / np; }

// The grid: column strips of the kernel's width, and row strips (whole 128-row chunks) so that the
// blocks about fill the SMs once (at least one strip).
struct Grid {
  int64_t col_strips, row_strips, rs;
};
Grid grid_of(int64_t n, int64_t out, int np) {
  Grid g;
  g.col_strips = std::max<int64_t>(1, (out + columns_per_block(np) - 1) / columns_per_block(np));
  const int64_t chunks = std::max<int64_t>(1, (n + kTm - 1) / kTm);
  const int64_t want = std::clamp<int64_t>(sm_count() / g.col_strips, 1, chunks);
  g.rs = (chunks + want - 1) / want * kTm;
  g.row_strips = std::max<int64_t>(1, (n + g.rs - 1) / g.rs);
  return g;
}

template <int kNp>
void launch(const bf16* dy, int64_t ld_dy, const bf16* b, int64_t ld_b, const bf16* t, int64_t ld_t, int64_t n,
            int64_t out, int mr, const Grid& g, float* part_dt, float* part_db, Stream s) {
  allow_dynamic_smem<lora_dy_kernel<kNp>>(Cfg<kNp>::kSmem);
  lora_dy_kernel<kNp><<<dim3(unsigned(g.col_strips), unsigned(g.row_strips)), kThreads, Cfg<kNp>::kSmem, s>>>(
      dy, ld_dy, b, ld_b, t, ld_t, n, out, mr, g.rs, part_dt, part_db);
  LOOM_CUDA_LAUNCH_CHECK();
}

bool aligned_rows(const bf16* p, int64_t ld) { return aligned16(p) && ld % 8 == 0; }

}  // namespace

bool lora_dy_products_supported(const bf16* dy, int64_t ld_dy, const bf16* b, int64_t ld_b, const bf16* t, int64_t ld_t,
                                int64_t out, int64_t r, int m) {
  const int64_t mr = int64_t(m) * r;
  return m >= 1 && r >= 1 && mr <= 128 && mr % 8 == 0 && out % 8 == 0 && aligned_rows(dy, ld_dy) &&
         aligned_rows(b, ld_b) && aligned_rows(t, ld_t);
}

int64_t lora_dy_products_workspace(int64_t n, int64_t out, int64_t r, int m) {
  const int np = padded_width(int64_t(m) * r);
  const Grid g = grid_of(n, out, np);
  return (g.col_strips * n + g.row_strips * out) * np;
}

void lora_dy_products(const bf16* dy, int64_t ld_dy, const bf16* b, int64_t ld_b, const bf16* t, int64_t ld_t,
                      int64_t n, int64_t out, int64_t r, int m, float alpha, float* dt, float* db, float* workspace,
                      Stream s) {
  LOOM_CHECK(lora_dy_products_supported(dy, ld_dy, b, ld_b, t, ld_t, out, r, m),
             "lora_dy_products: operands the kernel does not take (m r = ", int64_t(m) * r, ", out ", out,
             ", pitches ", ld_dy, ", ", ld_b, ", ", ld_t, ")");
  if (n == 0 || out == 0) {
    if (n > 0) LOOM_CUDA_CHECK(cudaMemsetAsync(dt, 0, size_t(n * r) * sizeof(float), s));
    if (out > 0) LOOM_CUDA_CHECK(cudaMemsetAsync(db, 0, size_t(out * r) * sizeof(float), s));
    return;
  }
  const int mr = int(int64_t(m) * r), np = padded_width(mr);
  const Grid g = grid_of(n, out, np);
  float* part_dt = workspace;
  float* part_db = workspace + g.col_strips * n * np;
  switch (np) {
    case 16: launch<16>(dy, ld_dy, b, ld_b, t, ld_t, n, out, mr, g, part_dt, part_db, s); break;
    case 32: launch<32>(dy, ld_dy, b, ld_b, t, ld_t, n, out, mr, g, part_dt, part_db, s); break;
    case 64: launch<64>(dy, ld_dy, b, ld_b, t, ld_t, n, out, mr, g, part_dt, part_db, s); break;
    default: launch<128>(dy, ld_dy, b, ld_b, t, ld_t, n, out, mr, g, part_dt, part_db, s); break;
  }
  reduce_kernel<<<blocks_for(n * r, 256), 256, 0, s>>>(part_dt, int(g.col_strips), n, np, r, m, 1.f, dt);
  LOOM_CUDA_LAUNCH_CHECK();
  reduce_kernel<<<blocks_for(out * r, 256), 256, 0, s>>>(part_db, int(g.row_strips), out, np, r, m, alpha, db);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace loom::cuda
