// CPU reference for kernels/linear_cross_entropy.h: the same chunked schedule as the CUDA path
// (cpu::gemm for the three products, a per-row log-sum-exp with an f64 sum), T = float, double, bf16.
#include "kernels/linear_cross_entropy.h"

#include "kernels/cpu/eigen_exp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace loom::cpu {
namespace {

template <class T>
constexpr GemmType gemm_type() {
  if constexpr (std::is_same_v<T, double>) return GemmType::kF64;
  else if constexpr (std::is_same_v<T, bf16>) return GemmType::kBF16;
  else return GemmType::kF32;
}

}  // namespace

template <class T>
void linear_cross_entropy(const T* h, const T* w, const int32_t* targets, Acc<T>* loss, T* dh, Acc<T>* dw,
                          int64_t n, int64_t vocab, int64_t hidden, float softcap, int32_t ignore_index,
                          int64_t chunk_rows) {
  using A = Acc<T>;
  const char* op = "cpu::linear_cross_entropy";
  LOOM_CHECK(n >= 0 && vocab > 0 && hidden > 0, op, ": bad shape n=", n, " vocab=", vocab, " hidden=", hidden);
  LOOM_CHECK(softcap >= 0.f, op, ": softcap must be >= 0 (0 = off), got ", softcap);
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = targets[i];
    LOOM_CHECK(t == ignore_index || (t >= 0 && t < vocab), op, ": target of row ", i, " is ", t,
               ", outside [0, ", vocab, ") and not ignore_index (", ignore_index, ")");
    count += t != ignore_index;
  }
  *loss = A(0);
  if (n == 0) {
    if (dw) std::fill(dw, dw + vocab * hidden, A(0));
    return;
  }
  const A row_scale = count > 0 ? A(1) / A(count) : A(0);
  const int64_t rows_max = linear_cross_entropy_chunk_rows(n, vocab, chunk_rows, std::is_same_v<T, bf16>);
  std::vector<A> logits(static_cast<size_t>(rows_max * vocab));
  std::vector<T> dlogits(static_cast<size_t>(rows_max * vocab));
  std::vector<double> row_loss(static_cast<size_t>(n), 0.0);
  for (int64_t r0 = 0; r0 < n; r0 += rows_max) {
    const int64_t rows = std::min(rows_max, n - r0);
    // logits [rows, vocab] = h[r0:r0+rows] [rows, hidden] * w^T [hidden, vocab]
    GemmArgs g;
    g.m = rows, g.n = vocab, g.k = hidden, g.trans_b = true;
    g.a = h + r0 * hidden, g.lda = hidden;
    g.b = w, g.ldb = hidden;
    g.c = logits.data(), g.ldc = vocab;
    g.ab_type = gemm_type<T>();
    g.c_type = std::is_same_v<T, double> ? GemmType::kF64 : GemmType::kF32;
    gemm(g);
    if constexpr (std::is_same_v<T, bf16>)  // bf16 logits, as the bf16 lm_head gives them
      for (A& x : logits) x = bf16_to_float(float_to_bf16(x));
    // The exps through exp_shifted (Eigen's vectorised exp); NaN is carried by hand.
#pragma omp parallel if (rows * vocab > 65536)
    {
      EigenRow<A> e(vocab);
      const A ninf = -std::numeric_limits<A>::infinity();
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        A* row = logits.data() + r * vocab;
        T* grad = dlogits.data() + r * vocab;
        const int32_t t = targets[r0 + r];
        A m = ninf;
        for (int64_t v = 0; v < vocab; ++v) {
          if (softcap > 0.f) row[v] = A(softcap) * std::tanh(row[v] / A(softcap));  // keep z; dz from z below
          m = nan_max(m, row[v]);  // a NaN logit makes the row's loss NaN
        }
        double sum = 0;
        if (std::isnan(m) || m == -ninf) {  // exp(inf - inf): NaN
          sum = std::numeric_limits<double>::quiet_NaN();
        } else if (m != ninf) {
          exp_shifted(row, vocab, m, e.data(), e);
          for (int64_t v = 0; v < vocab; ++v) sum += double(e(v));
        }
        const A lse = sum != 0 ? m + static_cast<A>(std::log(sum)) : m;
        if (t == ignore_index) {
          for (int64_t v = 0; v < vocab; ++v) grad[v] = from_acc<T>(A(0));
          continue;
        }
        row_loss[r0 + r] = double(lse - row[t]);
        if (std::isnan(lse))  // NaN probabilities, 0 at -inf logits as exp_shifted gives
          for (int64_t v = 0; v < vocab; ++v) e(v) = row[v] == ninf ? A(0) : std::numeric_limits<A>::quiet_NaN();
        else
          exp_shifted(row, vocab, lse, e.data(), e);
        for (int64_t v = 0; v < vocab; ++v) {
          const A z = row[v];
          // dz/dl = 1 - tanh^2(l / c) = 1 - (z / c)^2
          const A dz = softcap > 0.f ? A(1) - (z / A(softcap)) * (z / A(softcap)) : A(1);
          grad[v] = from_acc<T>((e(v) - (v == t ? A(1) : A(0))) * dz * row_scale);
        }
      }
    }
    if (dh) {
      // dh[r0:r0+rows] [rows, hidden] = dlogits [rows, vocab] * w [vocab, hidden]
      GemmArgs d;
      d.m = rows, d.n = hidden, d.k = vocab;
      d.a = dlogits.data(), d.lda = vocab;
      d.b = w, d.ldb = hidden;
      d.c = dh + r0 * hidden, d.ldc = hidden;
      d.ab_type = d.c_type = gemm_type<T>();
      gemm(d);
    }
    if (dw) {
      // dw [vocab, hidden] (+)= dlogits^T [vocab, rows] * h[r0:r0+rows] [rows, hidden]; the first
      // chunk overwrites
      GemmArgs d;
      d.m = vocab, d.n = hidden, d.k = rows, d.trans_a = true;
      d.a = dlogits.data(), d.lda = vocab;
      d.b = h + r0 * hidden, d.ldb = hidden;
      d.c = dw, d.ldc = hidden;
      d.ab_type = gemm_type<T>();
      d.c_type = std::is_same_v<T, double> ? GemmType::kF64 : GemmType::kF32;
      d.beta = r0 == 0 ? 0.f : 1.f;
      gemm(d);
    }
  }
  double total = 0;
  for (double x : row_loss) total += x;
  *loss = static_cast<A>(total * double(row_scale));
}

template <class T>
void scale_by_scalar(T* x, const Acc<T>* scalar, int64_t n) {
  const Acc<T> s = *scalar;
  for (int64_t i = 0; i < n; ++i) x[i] = from_acc<T>(to_acc(x[i]) * s);
}

#define LOOM_INST(T)                                                                                           \
  template void linear_cross_entropy<T>(const T*, const T*, const int32_t*, Acc<T>*, T*, Acc<T>*, int64_t,     \
                                        int64_t, int64_t, float, int32_t, int64_t);                            \
  template void scale_by_scalar<T>(T*, const Acc<T>*, int64_t);
LOOM_INST(float)
LOOM_INST(double)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cpu
