// CPU 8-bit AdamW against a straightforward f64 formulation (dequantise, update, requantise to the
// nearest code), the dynamic maps against their defining formula, and bitsandbytes' 32-bit rule.
#include <algorithm>
#include <cmath>

#include "kernels/adamw8bit.h"
#include "kernels/dynamic_map.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

struct Maps {
  float q1[256], q2[256];
  Maps() {
    dynamic_map(true, q1);
    dynamic_map(false, q2);
  }
};
const Maps& maps() {
  static const Maps m;
  return m;
}

// create_dynamic_map in exact arithmetic: 10^(i-6) * midpoints of linspace(0.1, 1, items).
std::vector<double> exact_map(bool is_signed) {
  std::vector<double> d;
  for (int i = 0; i < 7; ++i) {
    const int items = (1 << (i + (is_signed ? 0 : 1))) + 1;
    for (int j = 0; j + 1 < items; ++j) {
      const double mean = 0.1 + 0.9 * (j + 0.5) / (items - 1);
      d.push_back(std::pow(10.0, i - 6) * mean);
      if (is_signed) d.push_back(-std::pow(10.0, i - 6) * mean);
    }
  }
  d.push_back(0);
  d.push_back(1);
  std::sort(d.begin(), d.end());
  return d;
}

TEST(DynamicMap, MatchesItsFormulaWithinF32Rounding) {
  for (bool is_signed : {true, false}) {
    const float* q = is_signed ? maps().q1 : maps().q2;
    const auto exact = exact_map(is_signed);
    ASSERT_EQ(exact.size(), 256u);
    // A handful of f32 roundings (linspace, mean, scale): a few ulp, well under 1e-6 relative.
    for (int i = 0; i < 256; ++i) EXPECT_NEAR(q[i], exact[i], 1e-6 * std::abs(exact[i])) << is_signed << " " << i;
    for (int i = 1; i < 256; ++i) EXPECT_LT(q[i - 1], q[i]) << "sorted and distinct, " << i;
    EXPECT_EQ(q[255], 1.f);
  }
  EXPECT_EQ(maps().q1[127], 0.f);  // signed: 127 negatives, zero, 128 positives
  EXPECT_EQ(maps().q2[0], 0.f);
}

// The index of the code nearest to x in f64, and whether x is within `margin` of the midpoint
// between its two nearest codes (where f32 rounding may pick either).
struct Nearest {
  int index;
  bool near_tie;
};
Nearest nearest(const float* code, double x, double margin) {
  int best = 0, second = 1;
  double db = INFINITY, ds = INFINITY;
  for (int c = 0; c < 256; ++c) {
    const double d = std::abs(double(code[c]) - x);
    if (d < db) {
      second = best, ds = db;
      best = c, db = d;
    } else if (d < ds) {
      second = c, ds = d;
    }
  }
  (void)second;
  return {best, ds - db <= margin};
}

TEST(QuantizeDynamic, IsTheNearestCode) {
  const auto xs = random_vec<float>(20000, 7, -1.f, 1.f);
  for (bool is_signed : {true, false}) {
    const float* q = is_signed ? maps().q1 : maps().q2;
    int64_t bad = 0;
    for (float x0 : xs) {
      const float x = is_signed ? x0 : std::abs(x0) * std::abs(x0) * std::abs(x0);  // v/absmax crowds near 0
      const Nearest n = nearest(q, x, 1e-7 * std::max(1e-6, double(std::abs(x))));
      const int got = quantize_dynamic(q, x, is_signed);
      if (got != n.index && !n.near_tie) ++bad;
    }
    EXPECT_EQ(bad, 0) << "signed=" << is_signed;
  }
  for (bool is_signed : {true, false}) {  // the ends
    const float* q = is_signed ? maps().q1 : maps().q2;
    EXPECT_EQ(quantize_dynamic(q, 1.f, is_signed), 255);
    EXPECT_EQ(quantize_dynamic(q, is_signed ? -1.f : 0.f, is_signed), 0);
  }
}

// One step in f64 from the same stored state: dequantise, bitsandbytes' update, requantise.
struct Ref {
  std::vector<double> param, absmax1, absmax2;
  std::vector<Nearest> c1, c2;
};
template <class G>
Ref ref_step(const std::vector<float>& p, const std::vector<G>& g, const std::vector<uint8_t>& s1,
             const std::vector<uint8_t>& s2, const std::vector<float>& a1, const std::vector<float>& a2,
             const AdamWParams& hp) {
  const int64_t n = p.size(), blocks = adam8bit_blocks(n);
  const double b1 = hp.beta1, b2 = hp.beta2, t = double(hp.step);
  const double c1 = 1 - std::pow(b1, t), c2 = std::sqrt(1 - std::pow(b2, t));
  Ref r;
  r.param.resize(n);
  std::vector<double> m(blocks * kAdam8bitBlock), v(m.size());
  for (int64_t i = 0; i < int64_t(m.size()); ++i) {
    const int64_t b = i / kAdam8bitBlock;
    const bool real = i < n;
    const double gi = real ? double(to_acc(g[i])) * hp.grad_scale : 0.0;
    m[i] = b1 * double(maps().q1[real ? s1[i] : 128]) * a1[b] + (1 - b1) * gi;
    v[i] = b2 * double(maps().q2[real ? s2[i] : 0]) * a2[b] + (1 - b2) * gi * gi;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    double x1 = 0, x2 = 0;
    for (int j = 0; j < kAdam8bitBlock; ++j) {
      x1 = std::max(x1, std::abs(m[b * kAdam8bitBlock + j]));
      x2 = std::max(x2, std::abs(v[b * kAdam8bitBlock + j]));
    }
    r.absmax1.push_back(x1);
    r.absmax2.push_back(x2);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i / kAdam8bitBlock;
    double w = p[i] - hp.lr * c2 / c1 * m[i] / (std::sqrt(v[i]) + c2 * hp.eps);
    if (hp.weight_decay > 0) w *= 1 - double(hp.lr) * hp.weight_decay;
    r.param[i] = w;
    // The f32 moments carry a few roundings of 2^-24 relative: codes closer than that to a tie may go either way.
    r.c1.push_back(nearest(maps().q1, m[i] / r.absmax1[b], 1e-6 * std::abs(m[i] / r.absmax1[b]) + 1e-12));
    r.c2.push_back(nearest(maps().q2, v[i] / r.absmax2[b], 1e-6 * std::abs(v[i] / r.absmax2[b]) + 1e-12));
  }
  return r;
}

template <class G>
void run_8bit(int64_t n, float wd, float grad_scale) {
  AdamWParams hp;
  hp.lr = 1e-3f;
  hp.weight_decay = wd;
  hp.grad_scale = grad_scale;
  std::vector<float> p = random_vec<float>(n, 1), a1(adam8bit_blocks(n), 0.f), a2(a1.size(), 0.f);
  std::vector<uint8_t> s1(n, 0), s2(n, 0);  // bitsandbytes' zero-initialised state
  std::vector<bf16> p16(n);
  for (int64_t step = 1; step <= 5; ++step) {
    hp.step = step;
    const auto grad = random_vec<G>(n, 10 + step, -2.f, 2.f);
    const Ref r = ref_step(p, grad, s1, s2, a1, a2, hp);
    const std::vector<double> p_old(p.begin(), p.end());
    cpu::adamw8bit_step(p.data(), grad.data(), s1.data(), s2.data(), a1.data(), a2.data(), maps().q1, maps().q2, n, hp,
                        p16.data());
    // absmax: |m| after a product and a sum in f32 (2 roundings + the code's): 1e-6 relative.
    EXPECT_LT(rel_error(a1, r.absmax1), 1e-6) << "absmax1 step " << step;
    EXPECT_LT(rel_error(a2, r.absmax2), 1e-6) << "absmax2 step " << step;
    // The change of the parameter (~lr) against f64: a few f32 roundings, plus the parameter's own
    // rounding (2^-24 |p| <= 6e-8 against changes of ~1e-3): 1e-4 relative L2.
    std::vector<double> d(n), d_ref(n);
    for (int64_t i = 0; i < n; ++i) d[i] = p[i] - p_old[i], d_ref[i] = r.param[i] - p_old[i];
    EXPECT_LT(rel_error(d, d_ref), 1e-4) << "param change, step " << step;
    int64_t bad1 = 0, bad2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      bad1 += s1[i] != r.c1[i].index && !r.c1[i].near_tie;
      bad2 += s2[i] != r.c2[i].index && !r.c2[i].near_tie;
      ASSERT_EQ(p16[i].bits, float_to_bf16(p[i]).bits) << i;
    }
    EXPECT_EQ(bad1, 0) << "state1 codes off the nearest, step " << step;
    EXPECT_EQ(bad2, 0) << "state2 codes off the nearest, step " << step;
  }
}

TEST(AdamW8bitCpu, F32GradsMatchF64Formulation) { run_8bit<float>(5000, 0.f, 1.f); }
TEST(AdamW8bitCpu, Bf16GradsWithDecayAndScale) { run_8bit<bf16>(4096 + 300, 0.1f, 0.5f); }
TEST(AdamW8bitCpu, ExactBlocks) { run_8bit<float>(4 * 256, 0.01f, 1.f); }

// bitsandbytes keeps a zero block's state at code 255 of the signed map (0/0 lands on code 0, whose
// sign differs from +0, so it steps down and wraps), leaves params with non-finite gradients alone
// and zeroes their moments.
TEST(AdamW8bitCpu, ZeroBlocksAndNonFiniteGradients) {
  const int64_t n = 512;
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.step = 1;
  hp.weight_decay = 0.5f;
  std::vector<float> p = random_vec<float>(n, 3), grad(n, 0.f), a1(2, 0.f), a2(2, 0.f);
  for (int64_t i = 256; i < n; ++i) grad[i] = 0.25f;
  grad[300] = NAN;
  grad[301] = INFINITY;
  std::vector<uint8_t> s1(n, 0), s2(n, 0);
  const std::vector<float> p0 = p;
  cpu::adamw8bit_step(p.data(), grad.data(), s1.data(), s2.data(), a1.data(), a2.data(), maps().q1, maps().q2, n, hp,
                      nullptr);
  EXPECT_EQ(a1[0], 0.f);
  EXPECT_EQ(a2[0], 0.f);
  for (int64_t i = 0; i < 256; ++i) {
    EXPECT_EQ(s1[i], 255) << i;
    EXPECT_EQ(s2[i], 0) << i;
    EXPECT_EQ(p[i], p0[i] * (1.f - hp.lr * hp.weight_decay)) << "zero gradient: decay only, " << i;
  }
  EXPECT_EQ(p[300], p0[300]);
  EXPECT_EQ(p[301], p0[301]);
  EXPECT_FLOAT_EQ(a1[1], 0.1f * 0.25f);
  EXPECT_EQ(s1[400], 255);  // m == absmax quantises to 1.0
  EXPECT_EQ(s1[300], 127);  // m = 0 exactly: the signed map's zero
}

TEST(Adam32bitCpu, MatchesF64) {
  const int64_t n = 777;
  AdamWParams hp;
  hp.lr = 2e-3f;
  hp.weight_decay = 0.1f;
  std::vector<float> p = random_vec<float>(n, 4), m(n, 0.f), v(n, 0.f);
  std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
  for (int64_t step = 1; step <= 4; ++step) {
    hp.step = step;
    const auto g = random_vec<float>(n, 20 + step);
    // bitsandbytes takes the betas as f32 (0.999f, so 1 - beta2 is 1.3e-5 below 0.001): so does the reference.
    const double b1 = hp.beta1, b2 = hp.beta2;
    const double c1 = 1 - std::pow(b1, step), c2 = std::sqrt(1 - std::pow(b2, step));
    for (int64_t i = 0; i < n; ++i) {
      rm[i] = b1 * rm[i] + (1 - b1) * g[i];
      rv[i] = b2 * rv[i] + (1 - b2) * double(g[i]) * g[i];
      rp[i] = (rp[i] - hp.lr * c2 / c1 * rm[i] / (std::sqrt(rv[i]) + c2 * 1e-8)) * (1 - double(hp.lr) * 0.1);
    }
    cpu::adam32bit_step(p.data(), g.data(), m.data(), v.data(), n, hp, nullptr);
    // f32 state against f64: a few roundings per step (as for torch AdamW): 1e-6 relative.
    EXPECT_LT(rel_error(p, rp), 1e-6) << step;
    EXPECT_LT(rel_error(m, rm), 1e-6) << step;
    EXPECT_LT(rel_error(v, rv), 1e-6) << step;
  }
}

}  // namespace
}  // namespace loom::test
