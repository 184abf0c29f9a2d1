// LR schedules against transformers' formulas evaluated independently in f64 (and a few values
// worked out by hand), and clip_grad_norm against a naive f64 global norm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "train/schedule.h"

namespace loom {
namespace {

constexpr double kPi = 3.14159265358979323846;

// transformers.optimization, transcribed: Python float division, max(1, ...) guards.
double ref_warmup(long step, long warmup) { return double(step) / double(warmup > 1 ? warmup : 1); }
double ref_constant(long step, long warmup) { return step < warmup ? ref_warmup(step, warmup) : 1.0; }
double ref_linear(long step, long warmup, long total) {
  if (step < warmup) return ref_warmup(step, warmup);
  const long den = total - warmup > 1 ? total - warmup : 1;
  const double v = double(total - step) / double(den);
  return v > 0.0 ? v : 0.0;
}
double ref_cosine(long step, long warmup, long total, double cycles) {
  if (step < warmup) return ref_warmup(step, warmup);
  const long den = total - warmup > 1 ? total - warmup : 1;
  const double progress = double(step - warmup) / double(den);
  const double v = 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * progress));
  return v > 0.0 ? v : 0.0;
}

TEST(Schedule, HandWorkedValues) {
  // warmup 10, total 100
  EXPECT_DOUBLE_EQ(linear_with_warmup(0, 10, 100), 0.0);  // transformers' first update has lr 0
  EXPECT_DOUBLE_EQ(linear_with_warmup(5, 10, 100), 0.5);
  EXPECT_DOUBLE_EQ(linear_with_warmup(9, 10, 100), 0.9);
  EXPECT_DOUBLE_EQ(linear_with_warmup(10, 10, 100), 1.0);
  EXPECT_DOUBLE_EQ(linear_with_warmup(55, 10, 100), 0.5);
  EXPECT_DOUBLE_EQ(linear_with_warmup(100, 10, 100), 0.0);
  EXPECT_DOUBLE_EQ(linear_with_warmup(130, 10, 100), 0.0);  // clamped, never negative
  EXPECT_DOUBLE_EQ(constant_with_warmup(3, 4), 0.75);
  EXPECT_DOUBLE_EQ(constant_with_warmup(4, 4), 1.0);
  EXPECT_DOUBLE_EQ(constant_with_warmup(1000, 4), 1.0);
  EXPECT_DOUBLE_EQ(cosine_with_warmup(10, 10, 100), 1.0);
  EXPECT_NEAR(cosine_with_warmup(55, 10, 100), 0.5, 1e-15);
  EXPECT_NEAR(cosine_with_warmup(100, 10, 100), 0.0, 1e-15);
  // no warmup, total 4: 0.5 * (1 + cos(pi * k / 4))
  const double quarter[] = {1.0, 0.8535533905932737, 0.5, 0.14644660940672624, 0.0};
  for (int k = 0; k <= 4; ++k) EXPECT_NEAR(cosine_with_warmup(k, 0, 4), quarter[k], 1e-15) << k;
  // Past the end the default half-cycle keeps rising again, as transformers' formula does.
  EXPECT_NEAR(cosine_with_warmup(5, 0, 4), 0.14644660940672624, 1e-15);
}

TEST(Schedule, MatchesTransformersFormulas) {
  const long cases[][2] = {{0, 1}, {0, 7}, {1, 1}, {3, 10}, {10, 10}, {16, 100}, {100, 1000}, {7, 5}};
  for (const auto& c : cases) {
    const long warmup = c[0], total = c[1];
    for (long step = 0; step <= total + 3; ++step) {
      SCOPED_TRACE(testing::Message() << "warmup " << warmup << " total " << total << " step " << step);
      EXPECT_DOUBLE_EQ(constant_with_warmup(step, warmup), ref_constant(step, warmup));
      EXPECT_DOUBLE_EQ(linear_with_warmup(step, warmup, total), ref_linear(step, warmup, total));
      for (double cycles : {0.5, 1.0, 2.5})
        EXPECT_NEAR(cosine_with_warmup(step, warmup, total, cycles), ref_cosine(step, warmup, total, cycles), 1e-15);
    }
  }
}

TEST(Schedule, StructDispatchesAndScales) {
  for (LrScheduleKind kind : {LrScheduleKind::kConstant, LrScheduleKind::kLinear, LrScheduleKind::kCosine}) {
    LrSchedule s{kind, 4, 20, 0.5};
    auto parsed = parse_lr_schedule(lr_schedule_name(kind));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, kind);
    for (long step = 0; step <= 22; ++step) {
      const double ref = kind == LrScheduleKind::kConstant ? ref_constant(step, 4)
                         : kind == LrScheduleKind::kLinear ? ref_linear(step, 4, 20)
                                                           : ref_cosine(step, 4, 20, 0.5);
      EXPECT_NEAR(s.multiplier(step), ref, 1e-15) << lr_schedule_name(kind) << " step " << step;
      EXPECT_FLOAT_EQ(s.lr(2e-4f, step), static_cast<float>(2e-4 * ref));
    }
  }
  auto bad = parse_lr_schedule("cosine_with_restarts");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cosine_with_restarts"), std::string::npos) << bad.status();
}

TEST(Schedule, WarmupStepsFromRatio) {
  EXPECT_EQ(warmup_steps_for(0, 0.1, 95), 10);  // ceil(9.5)
  EXPECT_EQ(warmup_steps_for(0, 0.1, 100), 10);
  EXPECT_EQ(warmup_steps_for(0, 0.0, 100), 0);
  EXPECT_EQ(warmup_steps_for(5, 0.5, 100), 5);  // explicit steps win, as in TrainingArguments
}

// Random gradients of several shapes and dtypes; the naive norm reads the very values stored
// (after bf16 rounding) and sums their squares in f64.
std::vector<Tensor> random_grads(uint32_t seed, double* naive_sq) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  const std::vector<std::pair<Shape, DType>> specs = {
      {{17, 5}, DType::f32}, {{1}, DType::f32}, {{3, 4, 9}, DType::bf16}, {{1031}, DType::f32}, {{8, 3}, DType::f64}};
  std::vector<Tensor> grads;
  *naive_sq = 0;
  for (const auto& [shape, dtype] : specs) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    grads.push_back(Tensor::from_floats(v, shape).to(dtype));
    for (double x : grads.back().to_doubles()) *naive_sq += x * x;
  }
  return grads;
}

TEST(ClipGradNorm, NormAndCoefficientMatchNaive) {
  double sq = 0;
  std::vector<Tensor> grads = random_grads(7, &sq);
  grads.insert(grads.begin() + 2, Tensor());  // a parameter without a gradient is skipped
  const double norm = std::sqrt(sq);
  ASSERT_GT(norm, 10.0);
  for (float max_norm : {1.f, 0.5f * static_cast<float>(norm), 1e6f}) {
    GradNorm g = clip_grad_norm(grads, max_norm);
    // f32 partial sums over ~1.2k values of size <= 4: relative error well under 1e-5.
    EXPECT_NEAR(g.norm, norm, 1e-5 * norm) << max_norm;
    const double coef = std::min(1.0, max_norm / (norm + 1e-6));
    EXPECT_NEAR(g.coef, coef, 1e-5 * coef) << max_norm;
  }
  EXPECT_EQ(clip_grad_norm(grads, 1e6f).coef, 1.f);  // exactly 1 when not clipping
}

TEST(ClipGradNorm, InPlaceScalesEveryGradient) {
  double sq = 0;
  std::vector<Tensor> grads = random_grads(11, &sq);
  std::vector<std::vector<double>> before;
  for (const Tensor& g : grads) before.push_back(g.to_doubles());
  const GradNorm n = clip_grad_norm_(grads, 1.f);
  ASSERT_LT(n.coef, 0.2f);
  for (size_t i = 0; i < grads.size(); ++i) {
    const std::vector<double> after = grads[i].to_doubles();
    // One rounding of the product to the gradient's dtype: 2^-8 relative for bf16, 2^-23 for f32.
    const double tol = grads[i].dtype() == DType::bf16 ? 1.0 / 256 : 1.2e-7;
    for (size_t k = 0; k < after.size(); ++k)
      EXPECT_NEAR(after[k], before[i][k] * n.coef, tol * std::abs(before[i][k] * n.coef) + 1e-30) << i << "," << k;
  }
  // The clipped gradients now have norm max_norm (up to the 1e-6 guard and f32 rounding).
  EXPECT_NEAR(clip_grad_norm(grads, 1e6f).norm, 1.0, 1e-3);
  // Not clipping leaves the values untouched.
  std::vector<double> ref = grads[0].to_doubles();
  clip_grad_norm_(grads, 1e6f);
  EXPECT_EQ(grads[0].to_doubles(), ref);
}

TEST(ClipGradNorm, NonFinite) {
  std::vector<Tensor> grads = {Tensor::from_floats({1.f, std::numeric_limits<float>::quiet_NaN()}, {2})};
  GradNorm g = clip_grad_norm(grads, 1.f);
  EXPECT_TRUE(std::isnan(g.norm));
  EXPECT_TRUE(std::isnan(g.coef));  // as torch.clamp(nan, max=1): the step is poisoned, not hidden
  grads = {Tensor::from_floats({1.f, std::numeric_limits<float>::infinity()}, {2})};
  g = clip_grad_norm(grads, 1.f);
  EXPECT_TRUE(std::isinf(g.norm));
  EXPECT_EQ(g.coef, 0.f);
  EXPECT_EQ(clip_grad_norm({}, 1.f).norm, 0.f);
}

}  // namespace
}  // namespace loom
