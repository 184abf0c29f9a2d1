// CUDA 8-bit AdamW and bitsandbytes' 32-bit rule against the CPU reference over several steps:
// f32 and bf16 gradients, partial last blocks, zero blocks and non-finite gradients.
#include <cmath>
#include <cstring>

#include "kernels/adamw8bit.h"
#include "kernels/dynamic_map.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

template <class G>
class AdamW8bitCuda : public ::testing::Test {};
using GradTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(AdamW8bitCuda, GradTypes);

int64_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return bad;
}

// Both backends round every operation once in the same order (IEEE division and square root, no
// FMA) and the block maximum is exact in any order, so params, codes and absmax agree bit for bit.
TYPED_TEST(AdamW8bitCuda, MatchesCpuOverSeveralSteps) {
  LOOM_REQUIRE_GPU();
  using G = TypeParam;
  std::vector<float> q1(256), q2(256);
  dynamic_map(true, q1.data());
  dynamic_map(false, q2.data());
  DeviceBuffer<float> dq1(q1), dq2(q2);
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{4096}, int64_t{70001}}) {
    const int64_t blocks = adam8bit_blocks(n);
    AdamWParams hp;
    hp.lr = 2e-3f;
    hp.weight_decay = 0.05f;
    hp.grad_scale = 0.5f;
    std::vector<float> p = random_vec<float>(n, 1 + n), a1(blocks, 0.f), a2(blocks, 0.f);
    std::vector<uint8_t> s1(n, 0), s2(n, 0);
    std::vector<bf16> p16(n);
    DeviceBuffer<float> dp(p), da1(a1), da2(a2);
    DeviceBuffer<uint8_t> ds1(s1), ds2(s2);
    DeviceBuffer<bf16> dp16(n);
    for (int64_t step = 1; step <= 4; ++step) {
      hp.step = step;
      auto grad = random_vec<G>(n, 100 * step + n, -3.f, 3.f);
      if (step == 1 && n > 256)
        for (int64_t i = 0; i < 256; ++i) grad[i] = from_acc<G>(0.f);  // a zero block
      if (step == 2 && n > 10) grad[7] = from_acc<G>(NAN);
      DeviceBuffer<G> dg(grad);
      cpu::adamw8bit_step(p.data(), grad.data(), s1.data(), s2.data(), a1.data(), a2.data(), q1.data(), q2.data(), n,
                          hp, p16.data());
      cuda::adamw8bit_step(dp.get(), dg.get(), ds1.get(), ds2.get(), da1.get(), da2.get(), dq1.get(), dq2.get(), n, hp,
                           dp16.get(), nullptr);
      EXPECT_EQ(bit_mismatches(dp.to_host(), p), 0) << "param n=" << n << " step=" << step;
      EXPECT_EQ(bit_mismatches(da1.to_host(), a1), 0) << "absmax1 n=" << n << " step=" << step;
      EXPECT_EQ(bit_mismatches(da2.to_host(), a2), 0) << "absmax2 n=" << n << " step=" << step;
      EXPECT_EQ(ds1.to_host(), s1) << "state1 n=" << n << " step=" << step;
      EXPECT_EQ(ds2.to_host(), s2) << "state2 n=" << n << " step=" << step;
      const auto g16 = dp16.to_host();
      int64_t bad16 = 0;
      for (int64_t i = 0; i < n; ++i) bad16 += g16[i].bits != p16[i].bits;
      EXPECT_EQ(bad16, 0) << "param_bf16 n=" << n << " step=" << step;
    }
  }
}

TYPED_TEST(AdamW8bitCuda, Adam32bitMatchesCpu) {
  LOOM_REQUIRE_GPU();
  using G = TypeParam;
  const int64_t n = 3001;
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  std::vector<float> p = random_vec<float>(n, 5), m(n, 0.f), v(n, 0.f);
  DeviceBuffer<float> dp(p), dm(m), dv(v);
  for (int64_t step = 1; step <= 3; ++step) {
    hp.step = step;
    const auto grad = random_vec<G>(n, 50 + step);
    DeviceBuffer<G> dg(grad);
    cpu::adam32bit_step(p.data(), grad.data(), m.data(), v.data(), n, hp, nullptr);
    cuda::adam32bit_step(dp.get(), dg.get(), dm.get(), dv.get(), n, hp, nullptr, nullptr);
    EXPECT_EQ(bit_mismatches(dp.to_host(), p), 0) << step;
    EXPECT_EQ(bit_mismatches(dm.to_host(), m), 0) << step;
    EXPECT_EQ(bit_mismatches(dv.to_host(), v), 0) << step;
  }
}

}  // namespace
}  // namespace loom::test
