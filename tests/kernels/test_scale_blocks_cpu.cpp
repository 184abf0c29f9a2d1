// cpu::scale_blocks against its definition in f64: the listed blocks become beta times themselves
// (beta 3: the product of a bf16 or f32 value is exact in f64, so one rounding to T on both sides),
// zeros for beta 0 even over NaN (the value is not read), untouched for beta 1; every other block
// keeps its bits.
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/elementwise.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

template <class T>
class ScaleBlocksCpu : public ::testing::Test {};
using Types = ::testing::Types<float, double, bf16>;
TYPED_TEST_SUITE(ScaleBlocksCpu, Types);

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

TYPED_TEST(ScaleBlocksCpu, ListedBlocksOnly) {
  using T = TypeParam;
  const int64_t blocks = 9, block = 37;
  const int32_t listed[] = {0, 4, 8, 5};
  auto listed_has = [&](int64_t b) {
    for (int32_t l : listed)
      if (l == b) return true;
    return false;
  };
  for (float beta : {0.f, 3.f, 1.f}) {
    std::vector<T> x = random_vec<T>(size_t(blocks * block), 21, -4.f, 4.f);
    x[size_t(4 * block + 3)] = from_acc<T>(std::numeric_limits<Acc<T>>::quiet_NaN());  // a listed block
    x[size_t(2 * block + 1)] = from_acc<T>(std::numeric_limits<Acc<T>>::quiet_NaN());  // an unlisted one
    const std::vector<T> x0 = x;
    cpu::scale_blocks(x.data(), block, listed, 4, beta);
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t i = 0; i < block; ++i) {
        const size_t at = size_t(b * block + i);
        const double v = double(to_acc(x0[at]));
        if (!listed_has(b) || beta == 1.f) {
          EXPECT_TRUE(same_bits(x[at], x0[at])) << "block " << b << " element " << i << " beta " << beta;
        } else if (beta == 0.f) {
          EXPECT_EQ(double(to_acc(x[at])), 0.0) << "block " << b << " element " << i;
          EXPECT_FALSE(std::signbit(double(to_acc(x[at])))) << "block " << b << " element " << i;
        } else {
          const T want = from_acc<T>(static_cast<Acc<T>>(double(beta) * v));
          EXPECT_TRUE(std::isnan(v) ? std::isnan(double(to_acc(x[at]))) : same_bits(x[at], want))
              << "block " << b << " element " << i << ": " << double(to_acc(x[at])) << " for " << v;
        }
      }
  }
}

TEST(ScaleBlocksCpu, NothingListedOrEmptyBlocks) {
  std::vector<float> x = random_vec<float>(12, 3);
  const std::vector<float> x0 = x;
  cpu::scale_blocks(x.data(), 4, nullptr, 0, 0.f);
  const int32_t one[] = {1};
  cpu::scale_blocks(x.data(), 0, one, 1, 0.f);
  EXPECT_EQ(x, x0);
}

}  // namespace
}  // namespace loom::test
