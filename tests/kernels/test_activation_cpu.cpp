// CPU SwiGLU / GeGLU against naive f64 formulas (forward) and central finite differences of
// those formulas (backward), over gates that reach the saturated tails.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <numbers>

#include "kernels/activation.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {


// silu through tanh, independent of the kernel's exp form: sigmoid(g) = (1 + tanh(g / 2)) / 2.
double silu(double g) { return g * 0.5 * (1 + std::tanh(g / 2)); }
double gelu_tanh(double g) {
  return 0.5 * g * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (g + 0.044715 * g * g * g)));
}

template <class T>
class ActivationCpu : public ::testing::Test {};
using Types = ::testing::Types<float, double, bf16>;
TYPED_TEST_SUITE(ActivationCpu, Types);

template <class T, class Fwd, class Bwd>
void check(Fwd fwd, Bwd bwd, double (*act)(double)) {
  // Relative L2 over many gates: single elements deep in the negative tail (g < -5) are tiny
  // and, in the tanh form, carry large relative error in any precision (as in PyTorch).
  for (int64_t n : {17, 1000, 4099}) {
    auto g = random_vec<T>(n, 71 + n, -8.f, 8.f), u = random_vec<T>(n, 72 + n, -2.f, 2.f);
    auto d = random_vec<T>(n, 73 + n);
    std::vector<T> out(n), dg(n), du(n), value(n);
    fwd(g.data(), u.data(), out.data(), n);
    bwd(g.data(), u.data(), d.data(), dg.data(), du.data(), n, nullptr);
    // The backward's optional value is the forward's output, bit for bit, and leaves the gradients as they were.
    std::vector<T> dg2(n), du2(n);
    bwd(g.data(), u.data(), d.data(), dg2.data(), du2.data(), n, value.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(double(to_acc(value[i])), double(to_acc(out[i]))) << "n=" << n << " i=" << i;
      ASSERT_EQ(double(to_acc(dg2[i])), double(to_acc(dg[i])));
      ASSERT_EQ(double(to_acc(du2[i])), double(to_acc(du[i])));
    }
    std::vector<double> rout(n), rdg(n), rdu(n);
    const double h = 1e-5;
    for (int64_t i = 0; i < n; ++i) {
      const double gi = double(to_acc(g[i])), ui = double(to_acc(u[i])), di = double(to_acc(d[i]));
      rout[i] = act(gi) * ui;
      // Central difference: truncation ~ h^2 * f''' ~ 1e-10, far below every tolerance here but
      // f64's (checked at 1e-8 below).
      rdg[i] = di * ui * (act(gi + h) - act(gi - h)) / (2 * h);
      rdu[i] = di * act(gi);
    }
    EXPECT_LT(rel_error(to_f64(out), rout), ref_tol<T>()) << "n=" << n;
    const double fd_tol = std::max(ref_tol<T>(), 1e-8);
    EXPECT_LT(rel_error(to_f64(dg), rdg), fd_tol) << "n=" << n;
    EXPECT_LT(rel_error(to_f64(du), rdu), ref_tol<T>()) << "n=" << n;
  }
}

TYPED_TEST(ActivationCpu, SwigluMatchesNaive) {
  using T = TypeParam;
  check<T>(cpu::swiglu_forward<T>, cpu::swiglu_backward<T>, silu);
}

TYPED_TEST(ActivationCpu, GegluMatchesNaive) {
  using T = TypeParam;
  check<T>(cpu::geglu_forward<T>, cpu::geglu_backward<T>, gelu_tanh);
}

// Extreme gates: no NaN or inf from exp overflow, and the limits are right.
TEST(ActivationCpuF32, SaturatedGatesStayFinite) {
  std::vector<float> g = {-1000.f, -100.f, 100.f, 1000.f}, u(4, 1.f), d(4, 1.f), out(4), dg(4), du(4);
  cpu::swiglu_forward(g.data(), u.data(), out.data(), 4);
  cpu::swiglu_backward(g.data(), u.data(), d.data(), dg.data(), du.data(), 4);
  EXPECT_EQ(out[0], 0.f);
  EXPECT_EQ(out[3], 1000.f);
  EXPECT_EQ(dg[0], 0.f);
  EXPECT_EQ(dg[3], 1.f);
  cpu::geglu_forward(g.data(), u.data(), out.data(), 4);
  cpu::geglu_backward(g.data(), u.data(), d.data(), dg.data(), du.data(), 4);
  EXPECT_EQ(out[0], 0.f);
  EXPECT_EQ(out[3], 1000.f);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isfinite(dg[i]) && std::isfinite(du[i])) << i;
}

// A NaN gate reaches exactly its own outputs (the forward's, dgate, dup), wherever it falls in the
// kernels' chunks (a vector's first lane, the middle, the scalar tail), and no other element changes.
TYPED_TEST(ActivationCpu, NanGateReachesOnlyItsOwnOutputs) {
  using T = TypeParam;
  const int64_t n = 4099;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto g = random_vec<T>(n, 81, -8.f, 8.f), u = random_vec<T>(n, 82, -2.f, 2.f), d = random_vec<T>(n, 83);
  auto bad = g;
  const std::vector<int64_t> at = {0, 1001, 4095, 4098};
  for (int64_t i : at) bad[i] = from_acc<T>(static_cast<Acc<T>>(nan));
  using Fwd = void (*)(const T*, const T*, T*, int64_t);
  using Bwd = void (*)(const T*, const T*, const T*, T*, T*, int64_t, T*);
  for (auto [fwd, bwd] : {std::pair<Fwd, Bwd>{cpu::swiglu_forward<T>, cpu::swiglu_backward<T>},
                          std::pair<Fwd, Bwd>{cpu::geglu_forward<T>, cpu::geglu_backward<T>}}) {
    std::vector<T> out(n), dg(n), du(n), out2(n), dg2(n), du2(n);
    fwd(g.data(), u.data(), out.data(), n);
    bwd(g.data(), u.data(), d.data(), dg.data(), du.data(), n, nullptr);
    fwd(bad.data(), u.data(), out2.data(), n);
    bwd(bad.data(), u.data(), d.data(), dg2.data(), du2.data(), n, nullptr);
    for (int64_t i = 0; i < n; ++i) {
      const bool hit = std::find(at.begin(), at.end(), i) != at.end();
      for (auto [clean, dirty] : {std::pair{out[i], out2[i]}, std::pair{dg[i], dg2[i]}, std::pair{du[i], du2[i]}}) {
        const double c = double(to_acc(clean)), x = double(to_acc(dirty));
        if (hit) {
          EXPECT_TRUE(std::isnan(x)) << "i=" << i;
        } else {
          EXPECT_EQ(x, c) << "i=" << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom::test
