// The scaled RoPE tables of models/rope_scaling.h (linear, llama3) against independent f64
// evaluations of transformers' formulas (moved here with RopeScaling from kernels/rope.h).
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <utility>

#include "models/rope_scaling.h"

namespace loom {
namespace {

// Default and linear inv_freq against theta^(-2i/d) in f64: f32 pow and reciprocal, a few ulp.
TEST(RopeInvFreq, DefaultAndLinearMatchF64) {
  for (auto [d, theta] : {std::pair<int64_t, double>{64, 10000.0}, {128, 500000.0}, {128, 1e6}, {256, 10000.0}}) {
    auto inv = rope_inv_freq(d, RopeParams{theta, {}});
    RopeScaling lin;
    lin.kind = RopeScaling::Kind::kLinear;
    lin.factor = 4;
    auto inv_lin = rope_inv_freq(d, RopeParams{theta, lin});
    ASSERT_EQ(int64_t(inv.size()), d / 2);
    EXPECT_EQ(inv[0], 1.0f);
    for (int64_t i = 0; i < d / 2; ++i) {
      const double ref = std::pow(theta, -double(2 * i) / double(d));
      EXPECT_NEAR(inv[i], ref, 4e-7 * ref) << "d=" << d << " i=" << i;
      EXPECT_EQ(inv_lin[i], inv[i] / 4.0f);
    }
  }
}

// Llama 3.1 scaling against an independent f64 evaluation of transformers'
// _compute_llama3_parameters; all three regimes (high, medium, low frequency) must occur.
TEST(RopeInvFreq, Llama3MatchesF64Formula) {
  RopeScaling s;
  s.kind = RopeScaling::Kind::kLlama3;
  s.factor = 8;
  s.low_freq_factor = 1;
  s.high_freq_factor = 4;
  s.original_max_position_embeddings = 8192;
  const int64_t d = 128;
  const double theta = 500000.0;
  auto inv = rope_inv_freq(d, RopeParams{theta, s});
  ASSERT_EQ(int64_t(inv.size()), d / 2);
  int high = 0, medium = 0, low = 0;
  for (int64_t i = 0; i < d / 2; ++i) {
    const double f = std::pow(theta, -double(2 * i) / double(d));
    const double wavelen = 2 * std::numbers::pi / f;
    const double low_wl = s.original_max_position_embeddings / s.low_freq_factor;
    const double high_wl = s.original_max_position_embeddings / s.high_freq_factor;
    double ref;
    if (wavelen < high_wl) {
      ref = f;
      ++high;
    } else if (wavelen > low_wl) {
      ref = f / s.factor;
      ++low;
    } else {
      const double sm = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
      ref = (1 - sm) * f / s.factor + sm * f;
      ++medium;
    }
    // f32 arithmetic over ~8 operations: a few ulp (2^-24 each).
    EXPECT_NEAR(inv[i], ref, 2e-6 * ref) << "i=" << i;
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(medium, 0);
  EXPECT_GT(low, 0);
}

}  // namespace
}  // namespace loom
