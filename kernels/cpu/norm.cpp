// CPU reference for kernels/norm.h: RMSNorm forward and backward, one row at a time, statistics
// in Acc<T> (the row sums of squares and dot products are accumulated in f64).
#include "kernels/norm.h"

#include <cmath>
#include <vector>

namespace loom::cpu {

template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, Acc<T>* rstd, int64_t rows, int64_t cols, float eps,
                      bool add_one, int64_t ldy) {
  using A = Acc<T>;
  LOOM_CHECK(rows >= 0 && cols > 0, "rms_norm_forward: bad shape [", rows, ", ", cols, "]");
  if (ldy == 0) ldy = cols;
  LOOM_CHECK(ldy >= cols, "rms_norm_forward: output row stride ", ldy, " under ", cols, " columns");
  std::vector<A> g(cols);
  for (int64_t c = 0; c < cols; ++c) g[c] = add_one ? A(1) + to_acc(w[c]) : to_acc(w[c]);
#pragma omp parallel for if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double v = double(to_acc(xr[c]));
      ss += v * v;
    }
    const A inv = A(1) / std::sqrt(A(ss / double(cols)) + A(eps));
    if (rstd) rstd[r] = inv;
    for (int64_t c = 0; c < cols; ++c) y[r * ldy + c] = from_acc<T>(to_acc(xr[c]) * inv * g[c]);
  }
}

template <class T>
void rms_norm_backward(const T* x, const T* w, const Acc<T>* rstd, const T* dy, T* dx, Acc<T>* dw, int64_t rows,
                       int64_t cols, bool add_one) {
  using A = Acc<T>;
  LOOM_CHECK(rows >= 0 && cols > 0, "rms_norm_backward: bad shape [", rows, ", ", cols, "]");
  std::vector<A> g(cols);
  for (int64_t c = 0; c < cols; ++c) g[c] = add_one ? A(1) + to_acc(w[c]) : to_acc(w[c]);
#pragma omp parallel for if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    const A inv = rstd[r];
    double dot = 0;  // sum_j dy_j g_j x_j
    for (int64_t c = 0; c < cols; ++c) dot += double(to_acc(dyr[c]) * g[c]) * double(to_acc(xr[c]));
    const A coef = A(dot) * inv * inv * inv / A(cols);
    for (int64_t c = 0; c < cols; ++c)
      dx[r * cols + c] = from_acc<T>(inv * g[c] * to_acc(dyr[c]) - to_acc(xr[c]) * coef);
  }
  if (dw == nullptr) return;
#pragma omp parallel for if (rows * cols > 65536)
  for (int64_t c = 0; c < cols; ++c) {
    double acc = 0;
    for (int64_t r = 0; r < rows; ++r)
      acc += double(to_acc(dy[r * cols + c]) * to_acc(x[r * cols + c]) * rstd[r]);
    dw[c] += A(acc);
  }
}

#define LOOM_INST(T)                                                                                       \
  template void rms_norm_forward<T>(const T*, const T*, T*, Acc<T>*, int64_t, int64_t, float, bool, int64_t); \
  template void rms_norm_backward<T>(const T*, const T*, const Acc<T>*, const T*, T*, Acc<T>*, int64_t,   \
                                     int64_t, bool);
LOOM_INST(float)
LOOM_INST(double)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cpu
