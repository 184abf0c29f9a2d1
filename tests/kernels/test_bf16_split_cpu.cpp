// bf16 hi/lo splitting against its definition in f64: hi is x rounded to bf16, hi + lo recovers x
// to about 2^-16 relative, parts land in the blocks the pattern names; block_sum adds the blocks.
#include <cmath>

#include "kernels/bf16_split.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

TEST(Bf16Split, PartsAndReconstruction) {
  const int64_t rows = 37, k = 19;
  auto x = random_vec<float>(rows * k, 7);
  x[0] = 0.f;
  x[1] = 1e-30f;     // below bf16's normal range: hi is 0 or a bf16 denormal, lo what is left
  x[2] = 3.0e38f;    // near the top of the range
  std::vector<bf16> out(rows * 3 * k);
  SplitPattern p;
  p.parts[0] = 'h', p.parts[1] = 'l', p.parts[2] = 'h', p.count = 3;
  cpu::bf16_split(x.data(), out.data(), rows, k, p);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      const float v = x[r * k + j];
      const float hi = bf16_to_float(out[(r * 3 + 0) * k + j]), lo = bf16_to_float(out[(r * 3 + 1) * k + j]);
      EXPECT_EQ(hi, bf16_to_float(float_to_bf16(v))) << r << "," << j;
      EXPECT_EQ(bf16_to_float(out[(r * 3 + 2) * k + j]), hi);
      // |x - (hi + lo)| <= half an ulp of lo's bf16 rounding: 2^-9 |lo| <= 2^-17 |x|.
      EXPECT_LE(std::abs(double(v) - (double(hi) + double(lo))), std::ldexp(std::abs(double(v)), -16) + 1e-44)
          << v;
    }
}

TEST(Bf16Split, BlockSumAddsTheBlocks) {
  const int64_t rows = 5, k = 11;
  const int m = 3;
  auto in = random_vec<float>(rows * m * k, 8);
  std::vector<float> out(rows * k);
  cpu::block_sum(in.data(), out.data(), rows, k, m, 0.5f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      double s = 0;
      for (int b = 0; b < m; ++b) s += in[(r * m + b) * k + j];
      EXPECT_NEAR(out[r * k + j], 0.5 * s, 1e-6) << r << "," << j;
    }
}

}  // namespace
}  // namespace loom::test
