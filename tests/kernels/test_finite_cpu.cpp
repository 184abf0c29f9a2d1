// cpu::first_nonfinite against a plain std::isfinite loop, for every float type: NaN, +-inf, the
// largest finite values (which must not count), hits in a later chunk of a multi-threaded scan, and
// the first of several hits.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/finite.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

// Past kParallelFrom (2^24 elements), so the scan runs in parallel over 257 chunks (this size makes
// the test take about 2 s on the CI machine; only the NaN case runs at it).
constexpr int64_t kBig = (int64_t{1} << 24) + 65536 + 7;

template <class T>
int64_t naive_first(const std::vector<T>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(double(to_acc(v[i])))) return int64_t(i);
  return -1;
}

template <class T>
class FiniteCpu : public ::testing::Test {};
using Types = ::testing::Types<float, double, bf16>;
TYPED_TEST_SUITE(FiniteCpu, Types);

TYPED_TEST(FiniteCpu, MatchesIsfinite) {
  using T = TypeParam;
  using A = Acc<T>;
  const A bad[] = {std::numeric_limits<A>::quiet_NaN(), std::numeric_limits<A>::infinity(),
                   -std::numeric_limits<A>::infinity()};
  for (int64_t n : {int64_t{1}, int64_t{100}, kBig}) {
    std::vector<T> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = from_acc<T>(static_cast<A>(i % 2001) - A(1000));
    EXPECT_EQ(cpu::first_nonfinite(v.data(), n), -1) << n;
    // The largest finite value of the storage type is finite.
    v[size_t(n) / 2] = from_acc<T>(static_cast<A>(std::is_same_v<T, double> ? std::numeric_limits<double>::max()
                                                                          : 3.38e38f));
    EXPECT_EQ(cpu::first_nonfinite(v.data(), n), -1) << n;
    for (const A b : bad) {
      if (n == kBig && !std::isnan(b)) continue;  // the large case once: it is about the chunks and threads
      for (int64_t at : {int64_t{0}, n - 1, n * 3 / 4}) {
        const T old_at = v[size_t(at)], old_last = v[size_t(n - 1)];
        v[size_t(at)] = from_acc<T>(b);
        if (at != n - 1) v[size_t(n - 1)] = from_acc<T>(b);  // a later hit too: the first one counts
        ASSERT_EQ(cpu::first_nonfinite(v.data(), n), naive_first(v)) << n << " " << at;
        EXPECT_EQ(cpu::first_nonfinite(v.data(), n), at);
        // The copying scan finds the same element and copies every byte.
        std::vector<T> copy(v.size());
        EXPECT_EQ(cpu::copy_first_nonfinite(v.data(), copy.data(), n, sizeof(T)), at);
        EXPECT_EQ(std::memcmp(copy.data(), v.data(), v.size() * sizeof(T)), 0);
        v[size_t(n - 1)] = old_last;
        v[size_t(at)] = old_at;
      }
    }
  }
}

// f16 bit patterns: exponent 0x1f is inf (mantissa 0) or NaN; 0x7bff (65504) is finite.
TEST(FiniteCpuF16, BitPatterns) {
  std::vector<uint16_t> v(kBig, 0x3c00);  // 1.0
  v[7] = 0x7bff;
  v[8] = 0xfbff;
  EXPECT_EQ(cpu::first_nonfinite_f16(v.data(), kBig), -1);
  for (uint16_t b : {uint16_t{0x7c00}, uint16_t{0xfc00}, uint16_t{0x7e00}, uint16_t{0x7c01}}) {
    auto w = v;
    w[kBig - 3] = b;
    EXPECT_EQ(cpu::first_nonfinite_f16(w.data(), kBig), kBig - 3) << std::hex << b;
    std::vector<uint16_t> copy(w.size());
    EXPECT_EQ(cpu::copy_first_nonfinite(w.data(), copy.data(), kBig, 2, /*kind_f16=*/true), kBig - 3);
    EXPECT_EQ(copy, w);
  }
}

}  // namespace
}  // namespace loom::test
