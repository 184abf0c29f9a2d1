// CUDA counter-based fills against the CPU reference: uniform bit for bit, normal to within the
// stated agreement, odd sizes, and offsets that carry into the counter's high word.
#include <cstring>

#include "kernels/philox.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

template <class T>
class RandomCuda : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(RandomCuda, Types);

template <class T>
bool same_bits(const T& a, const T& b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

const int64_t kSizes[] = {1, 3, 4, 5, 1023, 65537, (1 << 20) + 3};
const uint64_t kOffsets[] = {0, 12345, 0xfffffffeull};  // the last crosses into counter word 1

// uniform_fill: the same integer bits, the same two f32 roundings (no FMA on the device), the same
// rounding to T: every element identical.
TYPED_TEST(RandomCuda, UniformIsBitIdenticalToCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  for (int64_t n : kSizes)
    for (uint64_t offset : kOffsets) {
      std::vector<T> ref(n);
      cpu::uniform_fill(ref.data(), n, 0x5eed5eedull + n, offset, -0.75f, 1.25f);
      DeviceBuffer<T> out(n);
      cuda::uniform_fill(out.get(), n, 0x5eed5eedull + n, offset, -0.75f, 1.25f, nullptr);
      const auto got = out.to_host();
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) bad += !same_bits(got[i], ref[i]);
      EXPECT_EQ(bad, 0) << "n=" << n << " offset=" << offset;
    }
}

// A misaligned output (one element past a 16-byte boundary) takes the lane-by-lane store path:
// the same bits as the CPU, and as the aligned vector path.
TYPED_TEST(RandomCuda, MisalignedOutputGivesTheSameBits) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  for (int64_t n : {int64_t(5), int64_t(1023), int64_t(65537)}) {
    std::vector<T> ref_u(n), ref_n(n);
    cpu::uniform_fill(ref_u.data(), n, 99, 7, -1.f, 1.f);
    cpu::normal_fill(ref_n.data(), n, 99, 7, 0.f, 1.f);
    DeviceBuffer<T> out(n + 1), aligned(n);
    cuda::uniform_fill(out.get() + 1, n, 99, 7, -1.f, 1.f, nullptr);
    auto got = out.to_host();
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += !same_bits(got[i + 1], ref_u[i]);
    EXPECT_EQ(bad, 0) << "uniform n=" << n;
    T poison;
    std::memset(&poison, 0xFF, sizeof poison);
    EXPECT_TRUE(same_bits(got[0], poison)) << "uniform_fill wrote before its output, n=" << n;
    cuda::normal_fill(out.get() + 1, n, 99, 7, 0.f, 1.f, nullptr);
    cuda::normal_fill(aligned.get(), n, 99, 7, 0.f, 1.f, nullptr);
    got = out.to_host();
    const auto want = aligned.to_host();
    bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += !same_bits(got[i + 1], want[i]);
    EXPECT_EQ(bad, 0) << "normal n=" << n << ": the scalar and vector store paths differ";
  }
}

// normal_fill runs Box-Muller in f64 with log/sqrt/sin/cos from glibc on the host and libdevice
// on the GPU (each within ~1-2 ulp of f64), then rounds once to f32. The f32 results therefore
// agree except when the f64 value sits within a few f64 ulps of an f32 rounding boundary
// (probability ~2^-27 per element): we require at most 1e-5 of the elements to differ, and those
// by at most one ulp of T (2^-23 relative for f32, 2^-8 for bf16).
TYPED_TEST(RandomCuda, NormalMatchesCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  const double ulp = std::is_same_v<T, bf16> ? 0x1p-8 : 0x1p-23;
  for (int64_t n : kSizes)
    for (uint64_t offset : kOffsets) {
      std::vector<T> ref(n);
      cpu::normal_fill(ref.data(), n, 77 + n, offset, 0.5f, 2.f);
      DeviceBuffer<T> out(n);
      cuda::normal_fill(out.get(), n, 77 + n, offset, 0.5f, 2.f, nullptr);
      const auto got = out.to_host();
      int64_t bad = 0;
      double worst = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (same_bits(got[i], ref[i])) continue;
        ++bad;
        const double g = to_acc(got[i]), r = to_acc(ref[i]);
        worst = std::max(worst, std::abs(g - r) / (std::max(std::abs(r), 1e-30) * ulp));
      }
      EXPECT_LE(bad, n / 100000) << "n=" << n << " offset=" << offset;
      EXPECT_LE(worst, 1.0) << "n=" << n << " offset=" << offset << " (in ulps of T)";
    }
}

}  // namespace
}  // namespace loom::test
