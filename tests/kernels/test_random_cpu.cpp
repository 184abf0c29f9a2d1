// Philox4x32-10 against the Random123 known-answer vectors, and the CPU uniform/normal fills:
// the counter convention, an independent f64 Box-Muller, and moments over 10^6 samples.
#include <algorithm>
#include <cmath>

#include "kernels/philox.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

// Random123's tests/kat_vectors for philox4x32 with 10 rounds: counter, key -> output.
TEST(PhiloxCpu, KnownAnswerVectors) {
  struct Kat {
    Philox4 ctr;
    uint32_t k0, k1;
    Philox4 expect;
  };
  const Kat kats[] = {
      {{{0u, 0u, 0u, 0u}}, 0u, 0u, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const Kat& kat : kats) {
    const Philox4 out = philox4x32_10(kat.ctr, kat.k0, kat.k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.v[i], kat.expect.v[i]) << "lane " << i;
  }
}

TEST(PhiloxCpu, BlockPacksCounterAndSeed) {
  const uint64_t seed = 0x0123456789abcdefull, counter = 0xfedcba9876543210ull;
  const Philox4 a = philox_block(seed, counter);
  const Philox4 b = philox4x32_10({{0x76543210u, 0xfedcba98u, 0u, 0u}}, 0x89abcdefu, 0x01234567u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.v[i], b.v[i]);
}

TEST(RandomCpu, UniformUsesTop24BitsOfEachLane) {
  const int64_t n = 23;  // not a multiple of 4
  const uint64_t seed = 42, offset = 0xfffffffeull;  // crosses into the counter's high word
  std::vector<float> out(n, NAN);
  cpu::uniform_fill(out.data(), n, seed, offset, 0.f, 1.f);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t x = philox_block(seed, offset + i / 4).v[i % 4];
    EXPECT_EQ(out[i], std::ldexp(double(x >> 8), -24)) << i;
  }
}

TEST(RandomCpu, OffsetsAdvanceByBlocksOfFour) {
  std::vector<float> whole(40), tail(32);
  cpu::uniform_fill(whole.data(), 40, 7, 100, -1.f, 1.f);
  cpu::uniform_fill(tail.data(), 32, 7, 102, -1.f, 1.f);  // skip 2 blocks = 8 elements
  for (int i = 0; i < 32; ++i) EXPECT_EQ(whole[8 + i], tail[i]) << i;
  std::vector<float> other(40);
  cpu::uniform_fill(other.data(), 40, 8, 100, -1.f, 1.f);  // another seed: another stream
  int same = 0;
  for (int i = 0; i < 40; ++i) same += whole[i] == other[i];
  EXPECT_LT(same, 2);
}

TEST(RandomCpu, OtherTypesRoundTheFloatValues) {
  const int64_t n = 1001;
  std::vector<float> f(n);
  std::vector<double> d(n);
  std::vector<bf16> h(n);
  cpu::normal_fill(f.data(), n, 3, 9, 0.5f, 2.f);
  cpu::normal_fill(d.data(), n, 3, 9, 0.5f, 2.f);
  cpu::normal_fill(h.data(), n, 3, 9, 0.5f, 2.f);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(d[i], double(f[i]));
    EXPECT_EQ(h[i].bits, float_to_bf16(f[i]).bits);
  }
  cpu::uniform_fill(f.data(), n, 3, 9, -3.f, 5.f);
  cpu::uniform_fill(h.data(), n, 3, 9, -3.f, 5.f);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(h[i].bits, float_to_bf16(f[i]).bits);
}

// Box-Muller written again from its definition in f64 (std::polar-like), on the raw Philox lanes.
TEST(RandomCpu, NormalIsBoxMullerOnLanePairs) {
  const int64_t n = 4003;
  const uint64_t seed = 0xabcdef, offset = 5;
  const float mean = -1.5f, sd = 3.f;
  std::vector<float> out(n, NAN);
  cpu::normal_fill(out.data(), n, seed, offset, mean, sd);
  const double two_pi = 2 * std::acos(-1.0);
  for (int64_t i = 0; i < n; ++i) {
    const Philox4 x = philox_block(seed, offset + i / 4);
    const int lane = i % 4, even = lane & ~1;
    const double u1 = std::ldexp(double(x.v[even] >> 8) + 1, -24), u2 = std::ldexp(double(x.v[even + 1] >> 8), -24);
    const double z = std::sqrt(-2 * std::log(u1)) * (lane % 2 ? std::sin(two_pi * u2) : std::cos(two_pi * u2));
    const double expect = mean + sd * z;
    EXPECT_NEAR(out[i], expect, 1e-6 * (1 + std::abs(expect))) << i;  // one f32 rounding
  }
}

// Moments over 10^6 samples; bounds are 5 standard errors of each estimator.
TEST(RandomCpu, UniformMoments) {
  const int64_t n = 1000000;
  const float lo = -2.f, hi = 3.f;
  std::vector<float> out(n);
  cpu::uniform_fill(out.data(), n, 1234, 0, lo, hi);
  double s = 0, s2 = 0;
  for (float x : out) s += x;
  const double mean = s / n;
  for (float x : out) s2 += (x - mean) * (x - mean);
  const double var = s2 / (n - 1), w = hi - lo;
  EXPECT_NEAR(mean, 0.5, 5 * w / std::sqrt(12.0 * n));
  // Var(sample variance) ~ (mu4 - sigma^4) / n with mu4 = w^4/80, sigma^4 = w^4/144.
  EXPECT_NEAR(var, w * w / 12, 5 * std::sqrt((1.0 / 80 - 1.0 / 144) * std::pow(w, 4) / n));
  EXPECT_GE(*std::min_element(out.begin(), out.end()), lo);
  EXPECT_LE(*std::max_element(out.begin(), out.end()), hi);
  EXPECT_LT(*std::min_element(out.begin(), out.end()), lo + 1e-4);
  EXPECT_GT(*std::max_element(out.begin(), out.end()), hi - 1e-4);
}

TEST(RandomCpu, NormalMoments) {
  const int64_t n = 1000000;
  const double mu = 0.5, sd = 2.0;
  std::vector<float> out(n);
  cpu::normal_fill(out.data(), n, 99, 17, float(mu), float(sd));
  double s = 0, s2 = 0, s4 = 0;
  int64_t within1 = 0;
  for (float x : out) s += x;
  const double mean = s / n;
  for (float x : out) {
    const double d = x - mean;
    s2 += d * d;
    s4 += d * d * d * d;
    within1 += std::abs(x - mu) < sd;
  }
  const double var = s2 / (n - 1), kurt = (s4 / n) / (var * var);
  EXPECT_NEAR(mean, mu, 5 * sd / std::sqrt(double(n)));
  EXPECT_NEAR(var, sd * sd, 5 * sd * sd * std::sqrt(2.0 / n));  // Var(s^2) = 2 sigma^4 / n
  EXPECT_NEAR(kurt, 3.0, 5 * std::sqrt(24.0 / n));              // Var(kurtosis) ~ 24 / n
  const double p1 = 0.6826894921370859;                          // P(|Z| < 1)
  EXPECT_NEAR(double(within1) / n, p1, 5 * std::sqrt(p1 * (1 - p1) / n));
}

}  // namespace
}  // namespace loom::test
