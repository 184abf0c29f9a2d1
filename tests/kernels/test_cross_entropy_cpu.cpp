// CPU cross-entropy against naive f64 formulas written here: lse and loss, the analytic gradient
// element by element, central finite differences of the loss, ignored rows and bad targets.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cross_entropy.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

struct Case {
  int64_t n, vocab;
  float softcap, range;  // logits uniform in [-range, range)
};
// Softcap cases use logits large enough that tanh bends them (Gemma 2 caps final logits at 30).
const Case kCases[] = {{6, 1, 0.f, 1.f}, {5, 37, 0.f, 3.f}, {4, 1000, 0.f, 2.f}, {5, 37, 30.f, 60.f},
                       {3, 1000, 10.f, 30.f}};

template <class T>
std::vector<double> as_double(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = double(to_acc(v[i]));
  return out;
}

// Row i's target: mostly random classes, every third row ignored.
std::vector<int32_t> make_targets(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i % 3 == 1 ? kIgnoreIndex : int32_t(gen() % vocab);
  return t;
}

double cap(double x, double softcap) { return softcap > 0 ? softcap * std::tanh(x / softcap) : x; }

double naive_lse(const double* x, int64_t vocab, double softcap) {
  double m = -INFINITY, s = 0;
  for (int64_t v = 0; v < vocab; ++v) m = std::max(m, cap(x[v], softcap));
  for (int64_t v = 0; v < vocab; ++v) s += std::exp(cap(x[v], softcap) - m);
  return m + std::log(s);
}

// L = sum_i dloss_i * (lse_i - z[i, t_i]) over rows that count.
double naive_loss(const std::vector<double>& x, const std::vector<int32_t>& t, const std::vector<double>& dloss,
                  int64_t vocab, double softcap) {
  double l = 0;
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i] != kIgnoreIndex)
      l += dloss[i] * (naive_lse(&x[i * vocab], vocab, softcap) - cap(x[i * vocab + t[i]], softcap));
  return l;
}

template <class T>
class CrossEntropyCpu : public ::testing::Test {};
using Types = ::testing::Types<double, float, bf16>;
TYPED_TEST_SUITE(CrossEntropyCpu, Types);

// Relative tolerances. lse and loss are never rounded to T: f64 reorders sums (1e-12); f32 loses
// ~|z| * 2^-24 in z - m and lse (1e-6 of |lse|, loss gets it absolutely). Gradients: f32 exp of an
// argument off by ~|z| 2^-24 (|z| <= 60: 4e-6 relative); bf16 adds a final rounding to 8 significant
// bits, at most 2^-8 = 3.9e-3 relative.
template <class T> double rtol() { return 1e-5; }
template <> double rtol<double>() { return 1e-12; }
template <> double rtol<bf16>() { return 4e-3; }

TYPED_TEST(CrossEntropyCpu, ForwardMatchesNaive) {
  using T = TypeParam;
  using A = Acc<T>;
  for (const Case& c : kCases) {
    auto x = random_vec<T>(c.n * c.vocab, 7 + c.vocab, -c.range, c.range);
    auto t = make_targets(c.n, c.vocab, 8);
    std::vector<A> loss(c.n, A(NAN)), lse(c.n, A(NAN));
    cpu::cross_entropy_forward(x.data(), t.data(), loss.data(), lse.data(), c.n, c.vocab, c.softcap, kIgnoreIndex);
    const auto xd = as_double(x);
    std::vector<double> ref_lse(c.n), ref_loss(c.n);
    for (int64_t i = 0; i < c.n; ++i) {
      ref_lse[i] = naive_lse(&xd[i * c.vocab], c.vocab, c.softcap);
      ref_loss[i] = t[i] == kIgnoreIndex ? 0.0 : ref_lse[i] - cap(xd[i * c.vocab + t[i]], c.softcap);
    }
    const std::string name = "n=" + std::to_string(c.n) + " vocab=" + std::to_string(c.vocab);
    const double abs_tol = std::is_same_v<T, double> ? 1e-12 : 2e-6 * c.range;
    expect_close(lse, ref_lse, std::is_same_v<T, double> ? 1e-12 : 1e-6, abs_tol, name + " lse");
    expect_close(loss, ref_loss, 0.0, abs_tol, name + " loss");
  }
}

TYPED_TEST(CrossEntropyCpu, BackwardMatchesNaiveAndFiniteDifferences) {
  using T = TypeParam;
  using A = Acc<T>;
  for (const Case& c : kCases) {
    auto x = random_vec<T>(c.n * c.vocab, 17 + c.vocab, -c.range, c.range);
    auto t = make_targets(c.n, c.vocab, 18);
    auto dloss = random_vec<A>(c.n, 19, 0.5f, 1.5f);
    std::vector<A> loss(c.n), lse(c.n);
    cpu::cross_entropy_forward(x.data(), t.data(), loss.data(), lse.data(), c.n, c.vocab, c.softcap, kIgnoreIndex);
    std::vector<T> grad(c.n * c.vocab, from_acc<T>(A(NAN)));
    cpu::cross_entropy_backward(x.data(), t.data(), lse.data(), dloss.data(), grad.data(), c.n, c.vocab, c.softcap,
                                kIgnoreIndex);
    const auto xd = as_double(x), dld = as_double(dloss);
    std::vector<double> ref(c.n * c.vocab, 0.0);
    for (int64_t i = 0; i < c.n; ++i) {
      if (t[i] == kIgnoreIndex) continue;
      const double l = naive_lse(&xd[i * c.vocab], c.vocab, c.softcap);
      for (int64_t v = 0; v < c.vocab; ++v) {
        const double xv = xd[i * c.vocab + v];
        const double dz = c.softcap > 0 ? 1 - std::pow(std::tanh(xv / c.softcap), 2) : 1.0;
        ref[i * c.vocab + v] = dld[i] * (std::exp(cap(xv, c.softcap) - l) - (v == t[i] ? 1 : 0)) * dz;
      }
    }
    const std::string name = "n=" + std::to_string(c.n) + " vocab=" + std::to_string(c.vocab);
    expect_close(grad, ref, rtol<T>(), 1e-12, name + " dlogits");
    if (c.vocab > 40) continue;  // finite differences on the small vocabularies only
    std::vector<double> fd(xd.size()), xp = xd;
    const double eps = 1e-6;
    for (size_t e = 0; e < xp.size(); ++e) {
      xp[e] = xd[e] + eps;
      const double up = naive_loss(xp, t, dld, c.vocab, c.softcap);
      xp[e] = xd[e] - eps;
      const double down = naive_loss(xp, t, dld, c.vocab, c.softcap);
      xp[e] = xd[e];
      fd[e] = (up - down) / (2 * eps);
    }
    // FD error: O(eps^2 |f'''|) + O(1e-16 |L| / eps) ~ 1e-9 absolute.
    expect_close(grad, fd, std::is_same_v<T, double> ? 0.0 : rtol<T>(), std::is_same_v<T, double> ? 1e-8 : 1e-7,
                 name + " dlogits vs finite differences");
  }
}

TEST(CrossEntropyCpuChecks, BadTargetThrowsNamingRowAndValue) {
  std::vector<float> x(4 * 37, 0.5f), loss(4), lse(4), dloss(4, 1.f), grad(4 * 37);
  std::vector<int32_t> t = {0, kIgnoreIndex, 37, 5};
  try {
    cpu::cross_entropy_forward(x.data(), t.data(), loss.data(), lse.data(), 4, 37, 0.f, kIgnoreIndex);
    ADD_FAILURE() << "target 37 with vocab 37 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("37"), std::string::npos) << e.what();
  }
  t[2] = -1;
  EXPECT_THROW(cpu::cross_entropy_backward(x.data(), t.data(), lse.data(), dloss.data(), grad.data(), 4, 37, 0.f,
                                           kIgnoreIndex),
               Error);
  t[2] = 36;  // a custom ignore_index is honoured and -100 is then a bad target
  EXPECT_THROW(cpu::cross_entropy_forward(x.data(), t.data(), loss.data(), lse.data(), 4, 37, 0.f, -1), Error);
}

TEST(CrossEntropyCpuChecks, IgnoredRowsAreZeroAndUniformLogitsGiveLogVocab) {
  const int64_t n = 3, vocab = 1000;
  std::vector<float> x(n * vocab, 0.25f), loss(n), lse(n), dloss(n, 2.f), grad(n * vocab, NAN);
  std::vector<int32_t> t = {3, kIgnoreIndex, 999};
  cpu::cross_entropy_forward(x.data(), t.data(), loss.data(), lse.data(), n, vocab, 0.f, kIgnoreIndex);
  EXPECT_NEAR(loss[0], std::log(1000.0), 1e-5);
  EXPECT_EQ(loss[1], 0.f);
  EXPECT_NEAR(lse[1], 0.25 + std::log(1000.0), 1e-5);
  cpu::cross_entropy_backward(x.data(), t.data(), lse.data(), dloss.data(), grad.data(), n, vocab, 0.f, kIgnoreIndex);
  for (int64_t v = 0; v < vocab; ++v) EXPECT_EQ(grad[vocab + v], 0.f);
  EXPECT_NEAR(grad[999 + 2 * vocab], 2.0 * (1e-3 - 1), 1e-6);
}

}  // namespace
}  // namespace loom::test
