// CPU AdamW step against a naive f64 transcription of torch.optim.AdamW over several steps,
// for f32 and bf16 gradients, with weight decay, gradient scaling and the bf16 parameter copy.
#include <cmath>

#include "kernels/adamw.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

// The algorithm as written in the PyTorch docs, in f64, one element at a time.
struct RefState {
  std::vector<double> p, m, v;
};
void ref_step(RefState& s, const std::vector<double>& grad, const AdamWParams& hp) {
  const double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps, wd = hp.weight_decay;
  const double bc1 = 1 - std::pow(b1, double(hp.step)), bc2 = 1 - std::pow(b2, double(hp.step));
  for (size_t i = 0; i < s.p.size(); ++i) {
    const double g = grad[i] * double(hp.grad_scale);
    s.p[i] -= lr * wd * s.p[i];
    s.m[i] = b1 * s.m[i] + (1 - b1) * g;
    s.v[i] = b2 * s.v[i] + (1 - b2) * g * g;
    const double m_hat = s.m[i] / bc1, v_hat = s.v[i] / bc2;
    s.p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
  }
}

template <class G>
void run_steps(float beta1, float grad_scale) {
  const int64_t n = 1031;
  AdamWParams hp;
  hp.lr = 1e-3f;
  hp.beta1 = beta1;
  hp.weight_decay = 0.1f;
  hp.grad_scale = grad_scale;
  std::vector<float> p = random_vec<float>(n, 1), m(n, 0.f), v(n, 0.f);
  std::vector<bf16> p16(n, float_to_bf16(NAN));
  RefState ref{std::vector<double>(p.begin(), p.end()), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  for (int64_t step = 1; step <= 6; ++step) {
    hp.step = step;
    const auto grad = random_vec<G>(n, 10 + step, -2.f, 2.f);
    std::vector<double> g64(n);
    for (int64_t i = 0; i < n; ++i) g64[i] = double(to_acc(grad[i]));
    ref_step(ref, g64, hp);
    cpu::adamw_step(p.data(), grad.data(), m.data(), v.data(), n, hp, p16.data());
    // f32 state vs f64: a few roundings of 2^-24 per step (the update itself is ~lr, so the
    // parameter's relative error is far below 1e-6); the moments carry the same few ulps.
    EXPECT_LT(rel_error(p, ref.p), 1e-6) << "param, step " << step;
    EXPECT_LT(rel_error(m, ref.m), 1e-6) << "exp_avg, step " << step;
    EXPECT_LT(rel_error(v, ref.v), 1e-6) << "exp_avg_sq, step " << step;
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(p16[i].bits, float_to_bf16(p[i]).bits) << i;
  }
}

TEST(AdamWCpu, F32GradsMatchNaiveF64) { run_steps<float>(0.9f, 1.f); }
TEST(AdamWCpu, Bf16GradsMatchNaiveF64) { run_steps<bf16>(0.9f, 1.f); }
TEST(AdamWCpu, GradScaleIsAppliedFirst) { run_steps<float>(0.9f, 0.25f); }
TEST(AdamWCpu, LerpLargeWeightBranch) { run_steps<float>(0.3f, 1.f); }  // 1 - beta1 >= 0.5

// First step, by hand: m = (1-b1) g, v = (1-b2) g^2, so m_hat = g, v_hat = g^2 and the update is
// lr * g / (|g| + eps) ~= lr * sign(g) on top of the decay.
TEST(AdamWCpu, FirstStepIsSignOfGradient) {
  const float p0[3] = {0.5f, -1.f, 2.f}, g[3] = {0.3f, -4.f, 1e-3f};
  float p[3] = {p0[0], p0[1], p0[2]}, m[3] = {}, v[3] = {};
  AdamWParams hp;
  hp.lr = 0.01f;
  hp.weight_decay = 0.5f;
  hp.step = 1;
  cpu::adamw_step(p, g, m, v, 3, hp, nullptr);
  for (int i = 0; i < 3; ++i) {
    const double expect = p0[i] * (1 - 0.01 * 0.5) - 0.01 * (g[i] > 0 ? 1 : -1);
    EXPECT_NEAR(p[i], expect, 1e-6) << i;
  }
}

// Reference (f64) of the update itself, to catch errors hidden by the parameter's magnitude.
TEST(AdamWCpu, UpdateMatchesNaiveF64) {
  const int64_t n = 517;
  AdamWParams hp;
  hp.lr = 3e-2f;
  hp.weight_decay = 0.f;
  std::vector<float> p = random_vec<float>(n, 3), m = random_vec<float>(n, 4, -0.1f, 0.1f),
                     v = random_vec<float>(n, 5, 1e-4f, 1e-2f);
  const auto grad = random_vec<float>(n, 6);
  hp.step = 4;
  RefState ref{std::vector<double>(p.begin(), p.end()), std::vector<double>(m.begin(), m.end()),
               std::vector<double>(v.begin(), v.end())};
  const std::vector<double> p_old = ref.p;
  ref_step(ref, std::vector<double>(grad.begin(), grad.end()), hp);
  cpu::adamw_step(p.data(), grad.data(), m.data(), v.data(), n, hp, nullptr);
  std::vector<double> d(n), d_ref(n);
  for (int64_t i = 0; i < n; ++i) {
    d[i] = double(p[i]) - p_old[i];
    d_ref[i] = ref.p[i] - p_old[i];
  }
  // The f32 change carries the parameter's rounding (2^-24 * |p| <= 6e-8) against a change of
  // ~3e-2: relative L2 error of the change below 1e-5.
  EXPECT_LT(rel_error(d, d_ref), 1e-5);
}

}  // namespace
}  // namespace loom::test
