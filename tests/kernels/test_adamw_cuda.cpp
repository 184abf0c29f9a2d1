// CUDA AdamW step against the CPU reference over several steps, f32 and bf16 gradients, odd sizes.
#include <cstring>
#include <memory>

#include "kernels/adamw.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

template <class G>
class AdamWCuda : public ::testing::Test {};
using GradTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(AdamWCuda, GradTypes);

int64_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return bad;
}

// Both backends apply the same sequence of IEEE f32 operations (no FMA contraction: the kernel
// uses __fmul_rn/__fadd_rn/__fdiv_rn/__fsqrt_rn), so param and both moments must agree bit for
// bit. The looser relative-L2 check (1e-6, a few ulps) says how far off a mismatch is if it happens.
TYPED_TEST(AdamWCuda, MatchesCpuOverSeveralSteps) {
  LOOM_REQUIRE_GPU();
  using G = TypeParam;
  for (int64_t n : {1, 255, 1000, 65537}) {
    for (float beta1 : {0.9f, 0.3f}) {  // both branches of PyTorch's lerp
      AdamWParams hp;
      hp.lr = 2e-3f;
      hp.beta1 = beta1;
      hp.weight_decay = 0.05f;
      hp.grad_scale = 0.5f;
      std::vector<float> p = random_vec<float>(n, 1 + n), m = random_vec<float>(n, 2 + n, -0.1f, 0.1f),
                         v = random_vec<float>(n, 3 + n, 0.f, 1e-2f);
      std::vector<bf16> p16(n);
      DeviceBuffer<float> dp(p), dm(m), dv(v);
      DeviceBuffer<bf16> dp16(n);
      for (int64_t step = 1; step <= 4; ++step) {
        hp.step = step;
        const auto grad = random_vec<G>(n, 100 * step + n, -3.f, 3.f);
        DeviceBuffer<G> dg(grad);
        cpu::adamw_step(p.data(), grad.data(), m.data(), v.data(), n, hp, p16.data());
        cuda::adamw_step(dp.get(), dg.get(), dm.get(), dv.get(), n, hp, dp16.get(), nullptr);
        const auto gp = dp.to_host(), gm = dm.to_host(), gv = dv.to_host();
        const auto gp16 = dp16.to_host();
        EXPECT_LT(rel_error(gp, p), 1e-6) << "n=" << n << " step=" << step;
        EXPECT_EQ(bit_mismatches(gp, p), 0) << "param n=" << n << " step=" << step << " beta1=" << beta1;
        EXPECT_EQ(bit_mismatches(gm, m), 0) << "exp_avg n=" << n << " step=" << step << " beta1=" << beta1;
        EXPECT_EQ(bit_mismatches(gv, v), 0) << "exp_avg_sq n=" << n << " step=" << step << " beta1=" << beta1;
        int64_t bad16 = 0;
        for (int64_t i = 0; i < n; ++i) bad16 += gp16[i].bits != p16[i].bits;
        EXPECT_EQ(bad16, 0) << "param_bf16 n=" << n << " step=" << step;
      }
    }
  }
}

TEST(AdamWCudaNoCopy, NullBf16CopyIsSkipped) {
  LOOM_REQUIRE_GPU();
  const int64_t n = 333;
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.step = 3;
  std::vector<float> p = random_vec<float>(n, 5), m = random_vec<float>(n, 6), v = random_vec<float>(n, 7, 0.f, 1.f);
  const auto grad = random_vec<float>(n, 8);
  DeviceBuffer<float> dp(p), dm(m), dv(v), dg(grad);
  cpu::adamw_step(p.data(), grad.data(), m.data(), v.data(), n, hp, nullptr);
  cuda::adamw_step(dp.get(), dg.get(), dm.get(), dv.get(), n, hp, nullptr, nullptr);
  EXPECT_LT(rel_error(dp.to_host(), p), 1e-6);
  EXPECT_EQ(bit_mismatches(dp.to_host(), p), 0);
}

// Many tensors in one call (more than one launch's 32, sizes from 0 up, each its own lr, weight
// decay, step and bf16 copy or none, the scale read on the device): every tensor as the CPU
// reference updates it alone, bit for bit.
TYPED_TEST(AdamWCuda, ManyTensorsMatchEachAlone) {
  LOOM_REQUIRE_GPU();
  using G = TypeParam;
  const int count = 71;
  struct One {
    std::vector<float> p, m, v;
    std::vector<G> g;
    std::vector<bf16> p16;
    AdamWParams hp;
    DeviceBuffer<float> dp, dm, dv;
    DeviceBuffer<G> dg;
    DeviceBuffer<bf16> dp16;
  };
  std::vector<std::unique_ptr<One>> t;  // (device buffers do not move)
  const float scale = 0.75f;
  DeviceBuffer<float> dscale(std::vector<float>{scale});
  std::vector<cuda::AdamWSpan> spans;
  for (int j = 0; j < count; ++j) {
    const int64_t n = j == 0 ? 0 : (j * 977) % 5000 + (j % 7 == 0 ? 70000 : 1);
    AdamWParams hp;
    hp.lr = 1e-3f * float(1 + j % 5);
    hp.beta1 = j % 2 ? 0.9f : 0.3f;
    hp.weight_decay = 0.01f * float(j % 3);
    hp.step = 1 + j % 4;
    hp.grad_scale = scale;
    auto p = random_vec<float>(n, 11 + j), m = random_vec<float>(n, 12 + j, -0.1f, 0.1f),
         v = random_vec<float>(n, 13 + j, 0.f, 1e-2f);
    auto g = random_vec<G>(n, 14 + j, -3.f, 3.f);
    t.push_back(std::unique_ptr<One>(new One{p, m, v, g, std::vector<bf16>(n), hp, DeviceBuffer<float>(p),
                                             DeviceBuffer<float>(m), DeviceBuffer<float>(v), DeviceBuffer<G>(g),
                                             DeviceBuffer<bf16>(n)}));
    One& o = *t.back();
    const bool copy = j % 3 != 0;
    cpu::adamw_step(o.p.data(), o.g.data(), o.m.data(), o.v.data(), n, hp, copy ? o.p16.data() : nullptr);
    spans.push_back({o.dp.get(), o.dg.get(), o.dm.get(), o.dv.get(), copy ? o.dp16.get() : nullptr, n,
                     adamw_scalars(hp)});
  }
  // beta1 differs per tensor only through the scalars; beta2, eps and the scale are shared.
  cuda::adamw_step_many<G>(spans.data(), count, t[0]->hp.beta2, t[0]->hp.eps, 1.f, dscale.get(), nullptr);
  for (int j = 0; j < count; ++j) {
    One& o = *t[j];
    EXPECT_EQ(bit_mismatches(o.dp.to_host(), o.p), 0) << "param of tensor " << j;
    EXPECT_EQ(bit_mismatches(o.dm.to_host(), o.m), 0) << "exp_avg of tensor " << j;
    EXPECT_EQ(bit_mismatches(o.dv.to_host(), o.v), 0) << "exp_avg_sq of tensor " << j;
    if (j % 3 != 0) {
      const auto gp16 = o.dp16.to_host();
      int64_t bad16 = 0;
      for (size_t i = 0; i < gp16.size(); ++i) bad16 += gp16[i].bits != o.p16[i].bits;
      EXPECT_EQ(bad16, 0) << "param_bf16 of tensor " << j;
    }
  }
}

}  // namespace
}  // namespace loom::test
