// CPU RMSNorm against naive f64 formulas (forward, and the backward through the explicit Jacobian)
// and, in f64, against central finite differences of the forward.
#include <cmath>

#include "kernels/norm.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

// Naive f64 forward: y = x / sqrt(mean(x^2) + eps) * g.
void naive_forward(const std::vector<double>& x, const std::vector<double>& w, std::vector<double>& y,
                   std::vector<double>& rstd, int64_t rows, int64_t cols, double eps, bool add_one) {
  y.assign(rows * cols, 0);
  rstd.assign(rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < cols; ++c) ms += x[r * cols + c] * x[r * cols + c] / double(cols);
    rstd[r] = 1 / std::sqrt(ms + eps);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = x[r * cols + c] * rstd[r] * (add_one ? 1 + w[c] : w[c]);
  }
}

// Naive f64 backward via the full Jacobian dy_j/dx_i = g_j (r delta_ij - x_i x_j r^3 / n).
void naive_backward(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& dy,
                    std::vector<double>& dx, std::vector<double>& dw, int64_t rows, int64_t cols, double eps,
                    bool add_one) {
  dx.assign(rows * cols, 0);
  dw.assign(cols, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = &x[r * cols];
    double ms = 0;
    for (int64_t c = 0; c < cols; ++c) ms += xr[c] * xr[c] / double(cols);
    const double rs = 1 / std::sqrt(ms + eps);
    for (int64_t i = 0; i < cols; ++i) {
      double acc = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const double g = add_one ? 1 + w[j] : w[j];
        const double jac = g * ((i == j ? rs : 0.0) - xr[i] * xr[j] * rs * rs * rs / double(cols));
        acc += dy[r * cols + j] * jac;
      }
      dx[r * cols + i] = acc;
      dw[i] += dy[r * cols + i] * xr[i] * rs;
    }
  }
}

double rel(const std::vector<double>& a, const std::vector<double>& b) { return rel_error(a, b); }

template <class T>
class RmsNormCpu : public ::testing::Test {};
using Types = ::testing::Types<float, double, bf16>;
TYPED_TEST_SUITE(RmsNormCpu, Types);

TYPED_TEST(RmsNormCpu, ForwardMatchesNaive) {
  using T = TypeParam;
  using A = Acc<T>;
  const float eps = 1e-5f;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {5, 128}, {2, 1000}}) {
    for (bool add_one : {false, true}) {
      auto x = random_vec<T>(rows * cols, 11 + cols, -2.f, 2.f), w = random_vec<T>(cols, 12 + cols);
      std::vector<T> y(rows * cols);
      std::vector<A> rstd(rows, A(-1));
      cpu::rms_norm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, cols, eps, add_one);
      std::vector<double> ry, rr;
      naive_forward(to_f64(x), to_f64(w), ry, rr, rows, cols, double(eps), add_one);
      EXPECT_LT(rel(to_f64(y), ry), ref_tol<T>()) << rows << "x" << cols << " add_one=" << add_one;
      // rstd is never rounded to T: f32 (or f64) accuracy for every dtype.
      EXPECT_LT(rel(to_f64(rstd), rr), sizeof(A) == 8 ? 1e-12 : 1e-6);
    }
  }
}

TYPED_TEST(RmsNormCpu, BackwardMatchesNaiveJacobian) {
  using T = TypeParam;
  using A = Acc<T>;
  const float eps = 1e-6f;
  // cols = 1 is left out: there dx = r g dy eps / (x^2 + eps) is pure cancellation, so relative
  // error against f64 is meaningless (the f64 finite-difference test below covers the formula).
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 2}, {4, 9}, {3, 130}}) {
    for (bool add_one : {false, true}) {
      auto x = random_vec<T>(rows * cols, 21 + cols, -2.f, 2.f), w = random_vec<T>(cols, 22 + cols);
      auto dy = random_vec<T>(rows * cols, 23 + cols);
      std::vector<T> y(rows * cols), dx(rows * cols);
      std::vector<A> rstd(rows);
      auto dw0 = random_vec<A>(cols, 24 + cols);  // dw accumulates: start from random values
      auto dw = dw0;
      cpu::rms_norm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, cols, eps, add_one);
      cpu::rms_norm_backward(x.data(), w.data(), rstd.data(), dy.data(), dx.data(), dw.data(), rows, cols, add_one);
      std::vector<double> rdx, rdw;
      naive_backward(to_f64(x), to_f64(w), to_f64(dy), rdx, rdw, rows, cols, double(eps), add_one);
      for (int64_t c = 0; c < cols; ++c) rdw[c] += double(dw0[c]);
      EXPECT_LT(rel(to_f64(dx), rdx), ref_tol<T>()) << rows << "x" << cols << " add_one=" << add_one;
      // dw is kept in Acc<T>: f32 rounding of sums of <= 4 products.
      EXPECT_LT(rel(to_f64(dw), rdw), sizeof(A) == 8 ? 1e-12 : 1e-6);
      // A frozen weight: dw = nullptr must still give the same dx.
      std::vector<T> dx2(rows * cols);
      cpu::rms_norm_backward(x.data(), w.data(), rstd.data(), dy.data(), dx2.data(), static_cast<A*>(nullptr), rows,
                             cols, add_one);
      EXPECT_EQ(rel(to_f64(dx2), to_f64(dx)), 0.0);
    }
  }
}

// f64: backward against central differences of L = sum(dy * y(x, w)).
TEST(RmsNormCpuF64, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, cols = 17;
  const float eps = 1e-5f;
  for (bool add_one : {false, true}) {
    auto x = random_vec<double>(rows * cols, 31, -2.f, 2.f), w = random_vec<double>(cols, 32);
    auto dy = random_vec<double>(rows * cols, 33);
    auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv) {
      std::vector<double> y(rows * cols), rs(rows);
      cpu::rms_norm_forward(xv.data(), wv.data(), y.data(), rs.data(), rows, cols, eps, add_one);
      double l = 0;
      for (int64_t i = 0; i < rows * cols; ++i) l += dy[i] * y[i];
      return l;
    };
    std::vector<double> y(rows * cols), rs(rows), dx(rows * cols), dw(cols, 0.0);
    cpu::rms_norm_forward(x.data(), w.data(), y.data(), rs.data(), rows, cols, eps, add_one);
    cpu::rms_norm_backward(x.data(), w.data(), rs.data(), dy.data(), dx.data(), dw.data(), rows, cols, add_one);
    const double h = 1e-6;
    std::vector<double> fdx(rows * cols), fdw(cols);
    for (int64_t i = 0; i < rows * cols; ++i) {
      auto xp = x, xm = x;
      xp[i] += h;
      xm[i] -= h;
      fdx[i] = (loss(xp, w) - loss(xm, w)) / (2 * h);
    }
    for (int64_t c = 0; c < cols; ++c) {
      auto wp = w, wm = w;
      wp[c] += h;
      wm[c] -= h;
      fdw[c] = (loss(x, wp) - loss(x, wm)) / (2 * h);
    }
    // Central differences: truncation O(h^2) ~ 1e-12, cancellation ~ 1e-16 / h ~ 1e-10.
    EXPECT_LT(rel(dx, fdx), 1e-7) << "add_one=" << add_one;
    EXPECT_LT(rel(dw, fdw), 1e-7) << "add_one=" << add_one;
  }
}

TEST(RmsNormCpuChecks, RejectsZeroColumns) {
  std::vector<float> x(4), w(1), y(4);
  EXPECT_THROW(cpu::rms_norm_forward(x.data(), w.data(), y.data(), static_cast<float*>(nullptr), 4, 0, 1e-5f, false),
               Error);
}

}  // namespace
}  // namespace loom::test
