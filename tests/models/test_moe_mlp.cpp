// MoeMlp (models/layers.h) with transformers 5.x's expert layout: gate_up [E, 2I, H] holding each
// expert's gate rows then its up rows, down [E, H, I]; against a per-token f64 loop of
// MixtralSparseMoeBlock (router logits, softmax, top k, renormalised or not, the chosen experts'
// down(silu(gate x) * up x) weighted and summed), in f64 and in f32; and full fine-tuning's gradients
// (router, experts, input) against f64 finite differences, through the inputs that backward makes
// again rather than keeps (the gathered rows, the weighted SwiGLU rows).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "models/layers.h"
#include "tests/autograd/gradcheck.h"

namespace loom {
namespace {

constexpr int64_t kT = 9, kH = 6, kI = 4, kE = 5;

Tensor random(const Shape& s, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> d(-1, 1);
  std::vector<double> v(numel_of(s));
  for (double& x : v) x = d(g);
  return Tensor::from_doubles(v, s);
}

std::vector<double> reference(const Tensor& xt, const Tensor& rt, const Tensor& gut, const Tensor& dt, int64_t k, bool renorm) {
  const auto x = xt.to_doubles(), router = rt.to_doubles(), gu = gut.to_doubles(), down = dt.to_doubles();
  std::vector<double> y(kT * kH, 0.0);
  for (int64_t t = 0; t < kT; ++t) {
    std::vector<double> p(kE, 0.0);
    for (int64_t e = 0; e < kE; ++e)
      for (int64_t c = 0; c < kH; ++c) p[e] += router[e * kH + c] * x[t * kH + c];
    const double mx = *std::max_element(p.begin(), p.end());
    double z = 0;
    for (double& q : p) z += q = std::exp(q - mx);
    std::vector<int64_t> order(kE);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += p[order[j]] / z;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[j];
      const double w = renorm ? p[e] / z / s : p[e] / z;
      for (int64_t c = 0; c < kH; ++c) {
        double acc = 0;
        for (int64_t i = 0; i < kI; ++i) {
          double g = 0, u = 0;
          for (int64_t q = 0; q < kH; ++q) {
            g += gu[(e * 2 * kI + i) * kH + q] * x[t * kH + q];       // gate: rows [0, I) of expert e
            u += gu[(e * 2 * kI + kI + i) * kH + q] * x[t * kH + q];  // up: rows [I, 2I)
          }
          acc += down[(e * kH + c) * kI + i] * (g / (1 + std::exp(-g)) * u);
        }
        y[t * kH + c] += w * acc;
      }
    }
  }
  return y;
}

TEST(MoeMlp, IsTransformersSparseMoeBlock) {
  const Tensor x = random({kT, kH}, 1), router = random({kE, kH}, 2), gu = random({kE, 2 * kI, kH}, 3),
               down = random({kE, kH, kI}, 4);
  for (DType dt : {DType::f64, DType::f32})
    for (bool renorm : {true, false}) {
      MoeMlp m;
      m.router = ag::Variable(router.to(dt), false);
      m.gate_up.weight = ag::Variable(gu.to(dt), false);
      m.gate_up.experts = kE, m.gate_up.out = 2 * kI, m.gate_up.in = kH;
      m.down.weight = ag::Variable(down.to(dt), false);
      m.down.experts = kE, m.down.out = kH, m.down.in = kI;
      m.top_k = 2, m.renormalize = renorm;
      RouterOutput r;
      const std::vector<double> got = m.forward(ag::Variable(x.to(dt), false), &r).value().to_doubles();
      const ag::Variable& logits = r.logits;
      const Tensor& choices = r.ids;
      const std::vector<double> want = reference(x, router, gu, down, 2, renorm);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(got[i], want[i], dt == DType::f64 ? 1e-12 : 1e-5) << name(dt) << " renorm " << renorm << " " << i;
      EXPECT_EQ(logits.shape(), (Shape{kT, kE}));
      EXPECT_EQ(choices.shape(), (Shape{kT, 2}));
    }
}

TEST(MoeMlp, FullFineTuningGradientsMatchFiniteDifferences) {
  bool checked = false;  // the first call has the inputs needing gradients; the differences' calls do not
  auto layer = [&checked](const std::vector<ag::Variable>& v) {
    MoeMlp m;
    m.router = v[1];
    m.gate_up.weight = v[2];
    m.gate_up.experts = kE, m.gate_up.out = 2 * kI, m.gate_up.in = kH;
    m.down.weight = v[3];
    m.down.experts = kE, m.down.out = kH, m.down.in = kI;
    m.top_k = 2;
    if (!checked) {
      EXPECT_TRUE(m.gate_up.keeps_input() && m.down.keeps_input()) << "trained experts keep their inputs";
    }
    checked = true;
    return m.forward(v[0]);
  };
  test::gradcheck(layer, {random({kT, kH}, 5), random({kE, kH}, 6), random({kE, 2 * kI, kH}, 7), random({kE, kH, kI}, 8)});
}

}  // namespace
}  // namespace loom
