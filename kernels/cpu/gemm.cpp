// CPU reference GEMM (kernels/gemm.h) through Eigen, plus the argument checks both backends share.
#include "kernels/gemm.h"

#include <omp.h>

// GCC 12 warns that Eigen's AVX-512 packets "may be used uninitialized" inside its own intrinsic
// headers, inlined into this file's products, when built with -march=native on an AVX-512 machine:
// not Loom's code, and the warning is raised where the products are, so it is off for the file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#include <algorithm>
#include <type_traits>
#include <vector>

namespace loom {

const char* gemm_type_name(GemmType t) {
  switch (t) {
    case GemmType::kF32: return "f32";
    case GemmType::kBF16: return "bf16";
    case GemmType::kF64: return "f64";
  }
  return "?";
}

void check_gemm_args(const GemmArgs& g, const char* backend) {
  const auto shape = [&] {
    return detail::cat(" [", backend, " gemm m=", g.m, " n=", g.n, " k=", g.k, " batch=", g.batch,
                       " trans_a=", g.trans_a, " trans_b=", g.trans_b, " lda=", g.lda, " ldb=", g.ldb,
                       " ldc=", g.ldc, " ", gemm_type_name(g.ab_type), "->", gemm_type_name(g.c_type), "]");
  };
  LOOM_CHECK(g.m >= 0 && g.n >= 0 && g.batch >= 0, "gemm: m, n and batch must be >= 0", shape());
  LOOM_CHECK(g.k >= 1, "gemm: k must be >= 1 (an empty product is a scale of C, not a GEMM)", shape());
  const bool ok_types = (g.ab_type == GemmType::kF32 && g.c_type == GemmType::kF32) ||
                        (g.ab_type == GemmType::kBF16 && g.c_type == GemmType::kBF16) ||
                        (g.ab_type == GemmType::kBF16 && g.c_type == GemmType::kF32) ||
                        (g.ab_type == GemmType::kF64 && g.c_type == GemmType::kF64);
  LOOM_CHECK(ok_types, "gemm: unsupported type pair (f32->f32, bf16->bf16, bf16->f32, f64->f64)", shape());
  // Row-major storage: ld is at least the stored row length.
  const int64_t a_cols = g.trans_a ? g.m : g.k, b_cols = g.trans_b ? g.k : g.n;
  LOOM_CHECK(g.lda >= a_cols && g.lda >= 1, "gemm: lda must be >= ", a_cols, " (stored A is ",
             g.trans_a ? g.k : g.m, "x", a_cols, ")", shape());
  LOOM_CHECK(g.ldb >= b_cols && g.ldb >= 1, "gemm: ldb must be >= ", b_cols, " (stored B is ",
             g.trans_b ? g.n : g.k, "x", b_cols, ")", shape());
  LOOM_CHECK(g.ldc >= g.n && g.ldc >= 1, "gemm: ldc must be >= n", shape());
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  LOOM_CHECK(g.a != nullptr && g.b != nullptr && g.c != nullptr, "gemm: null pointer", shape());
  if (g.batch > 1) {
    LOOM_CHECK(g.stride_a >= 0 && g.stride_b >= 0, "gemm: negative batch stride", shape());
    LOOM_CHECK(g.stride_c > 0, "gemm: stride_c must be > 0 when batch > 1 (items would overwrite each other)",
               shape());
  }
}

}  // namespace loom

namespace loom::cpu {
namespace {

template <class S>
using RowMat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using ConstMap = Eigen::Map<const RowMat<S>, Eigen::Unaligned, Eigen::OuterStride<>>;

// One stored operand of batch item b as an Eigen map in compute type S. bf16 is widened into
// `scratch` (packed, ld = cols); f32/f64 are mapped in place.
template <class S>
ConstMap<S> operand(const void* base, GemmType type, int64_t offset, int64_t rows, int64_t cols, int64_t ld,
                    std::vector<S>& scratch) {
  if (type == GemmType::kBF16) {
    const bf16* p = static_cast<const bf16*>(base) + offset;
    scratch.resize(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) scratch[r * cols + c] = static_cast<S>(bf16_to_float(p[r * ld + c]));
    return ConstMap<S>(scratch.data(), rows, cols, Eigen::OuterStride<>(cols));
  }
  const S* p = static_cast<const S*>(base) + offset;
  return ConstMap<S>(p, rows, cols, Eigen::OuterStride<>(ld));
}

// Products smaller than this many multiply-adds run on one thread (a parallel region costs more).
constexpr int64_t kParallelWork = int64_t{1} << 18;

// Threads split C into row blocks (or column blocks when n > m) and each runs a single-threaded
// Eigen product on its block, writing C directly: one parallel region and one barrier per GEMM.
// Eigen's own OpenMP GEMM shares packed panels between threads and busy-waits on them at every
// block, which on 2 cores spent most of a LoRA training step spinning, not multiplying.
template <class S, class CT>
void gemm_typed(const GemmArgs& g) {
  std::vector<S> sa, sb;
  const S alpha = static_cast<S>(g.alpha), beta = static_cast<S>(g.beta);
  const int threads = g.m * g.n * g.k >= kParallelWork && !omp_in_parallel() ? omp_get_max_threads() : 1;
  const bool split_rows = g.m >= g.n;
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    // A stored [m, k] or [k, m]; B stored [k, n] or [n, k].
    auto a = operand<S>(g.a, g.ab_type, bi * g.stride_a, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, sa);
    auto b = operand<S>(g.b, g.ab_type, bi * g.stride_b, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, sb);
    CT* c = static_cast<CT*>(g.c) + bi * g.stride_c;
    const CT* c_in = static_cast<const CT*>(g.c_in ? g.c_in : g.c) + bi * g.stride_c;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      // Block edges on multiples of 16 (an AVX-512 register of f32) so every block but the last is
      // whole vectors wide.
      const int64_t extent = split_rows ? g.m : g.n;
      const int64_t step = (extent + nt - 1) / nt, per = (step + 15) / 16 * 16;
      const int64_t lo = std::min(extent, t * per), hi = std::min(extent, lo + per);
      const int64_t r0 = split_rows ? lo : 0, rows = split_rows ? hi - lo : g.m;
      const int64_t c0 = split_rows ? 0 : lo, cols = split_rows ? g.n : hi - lo;
      if (rows > 0 && cols > 0) {
        // op(A) rows [r0, r0 + rows) times op(B) columns [c0, c0 + cols), accumulated in S.
        auto product = [&](auto&& out) {
          if (!g.trans_a && !g.trans_b) out.noalias() = a.middleRows(r0, rows) * b.middleCols(c0, cols);
          else if (g.trans_a && !g.trans_b) out.noalias() = a.middleCols(r0, rows).transpose() * b.middleCols(c0, cols);
          else if (!g.trans_a && g.trans_b) out.noalias() = a.middleRows(r0, rows) * b.middleRows(c0, cols).transpose();
          else out.noalias() = a.middleCols(r0, rows).transpose() * b.middleRows(c0, cols).transpose();
        };
        bool direct = false;  // the common case: straight into C
        if constexpr (std::is_same_v<S, CT>) {
          direct = g.alpha == 1.f && g.beta == 0.f;
          if (direct) {
            Eigen::Map<RowMat<S>, Eigen::Unaligned, Eigen::OuterStride<>> out(c + r0 * g.ldc + c0, rows, cols,
                                                                               Eigen::OuterStride<>(g.ldc));
            product(out);
          }
        }
        if (!direct) {
          RowMat<S> prod(rows, cols);
          product(prod);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < cols; ++j) {
              const int64_t at = (r0 + r) * g.ldc + c0 + j;
              S v = alpha * prod(r, j);
              if (g.beta != 0.f) v += beta * static_cast<S>(to_acc(c_in[at]));  // beta == 0 never reads C
              c[at] = from_acc<CT>(v);
            }
        }
      }
    }
  }
}

// Rows of C from bf16 operands when op(A) has at most this many (decoding: a token's activations
// times a weight matrix).
constexpr int64_t kFewRows = 8;

// C = alpha op(A) op(B) + beta C for bf16 A and B with m <= kFewRows. Each thread reads its columns
// of op(B) as bf16 and widens them in registers: widening all of B into an f32 copy first (as the
// general path does) writes and rereads twice the weight's bytes, on one thread, for a product that
// reads each weight once; decoding in bf16 ran 6x slower than in f32 that way.
template <class CT>
void gemm_bf16_few_rows(const GemmArgs& g) {
  const int64_t m = g.m, n = g.n, k = g.k;
  const int threads = m * n * k >= kParallelWork && !omp_in_parallel() ? omp_get_max_threads() : 1;
  std::vector<float> a(static_cast<size_t>(m * k));
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const bf16* pa = static_cast<const bf16*>(g.a) + bi * g.stride_a;
    const bf16* pb = static_cast<const bf16*>(g.b) + bi * g.stride_b;
    CT* c = static_cast<CT*>(g.c) + bi * g.stride_c;
    const CT* c_in = static_cast<const CT*>(g.c_in ? g.c_in : g.c) + bi * g.stride_c;
    for (int64_t i = 0; i < m; ++i)  // op(A) [m, k], packed in f32
      for (int64_t kk = 0; kk < k; ++kk)
        a[i * k + kk] = bf16_to_float(g.trans_a ? pa[kk * g.lda + i] : pa[i * g.lda + kk]);
    constexpr int64_t kCols = 16, kLanes = 16;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t j0 = 0; j0 < n; j0 += kCols) {
      const int64_t cols = std::min(kCols, n - j0);
      float acc[kFewRows][kCols] = {};
      if (g.trans_b) {  // B stored [n, k]: column j of op(B) is row j of B, contiguous in k
        for (int64_t j = 0; j < cols; ++j) {
          const bf16* w = pb + (j0 + j) * g.ldb;
          for (int64_t i = 0; i < m; ++i) {
            const float* x = a.data() + i * k;
            float part[kLanes] = {};  // kLanes independent sums: one vector register
            int64_t kk = 0;
            for (; kk + kLanes <= k; kk += kLanes)
              for (int64_t l = 0; l < kLanes; ++l) part[l] += x[kk + l] * bf16_to_float(w[kk + l]);
            float sum = 0;
            for (; kk < k; ++kk) sum += x[kk] * bf16_to_float(w[kk]);
            for (int64_t l = 0; l < kLanes; ++l) sum += part[l];
            acc[i][j] = sum;
          }
        }
      } else {  // B stored [k, n]: row kk of B is contiguous over this block's columns
        for (int64_t kk = 0; kk < k; ++kk) {
          const bf16* w = pb + kk * g.ldb + j0;
          float wf[kCols];
          for (int64_t j = 0; j < cols; ++j) wf[j] = bf16_to_float(w[j]);
          for (int64_t i = 0; i < m; ++i) {
            const float x = a[i * k + kk];
            for (int64_t j = 0; j < cols; ++j) acc[i][j] += x * wf[j];
          }
        }
      }
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t at = i * g.ldc + j0 + j;
          float v = static_cast<float>(g.alpha) * acc[i][j];
          if (g.beta != 0.f) v += static_cast<float>(g.beta) * to_acc(c_in[at]);  // beta == 0 never reads C
          c[at] = from_acc<CT>(v);
        }
    }
  }
}

}  // namespace

void gemm(const GemmArgs& g) {
  check_gemm_args(g, "cpu");
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  if (g.ab_type == GemmType::kF64) return gemm_typed<double, double>(g);
  if (g.ab_type == GemmType::kBF16 && g.m <= kFewRows)
    return g.c_type == GemmType::kBF16 ? gemm_bf16_few_rows<bf16>(g) : gemm_bf16_few_rows<float>(g);
  if (g.c_type == GemmType::kBF16) return gemm_typed<float, bf16>(g);
  return gemm_typed<float, float>(g);
}

}  // namespace loom::cpu
