// CUDA global gradient norm and clipping coefficient (kernels/grad_norm.h) against the f64 sum of
// squares of the same values: f32 and bf16 gradients mixed, more than one launch's worth of tensors
// (64 a launch), tensors longer than a chunk (16384 values), empty ones; NaN and no gradient.
#include <cmath>
#include <limits>
#include <memory>

#include "kernels/grad_norm.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

struct Grads {
  std::vector<std::unique_ptr<DeviceBuffer<float>>> f32;
  std::vector<std::unique_ptr<DeviceBuffer<bf16>>> b16;
  std::vector<cuda::GradSpan> spans;
  double sq = 0;  // f64 sum of squares of the values as stored
};

Grads make_grads(int count) {
  Grads g;
  for (int i = 0; i < count; ++i) {
    const int64_t n = i % 7 == 3 ? 0 : i % 11 == 5 ? 40000 + i : 17 * (i + 1);  // some empty, some > a chunk
    if (i % 3 == 1) {
      const auto v = random_vec<bf16>(n, 100 + i);
      for (bf16 x : v) g.sq += double(to_acc(x)) * to_acc(x);
      g.b16.push_back(std::make_unique<DeviceBuffer<bf16>>(v));
      g.spans.push_back({g.b16.back()->get(), n, true});
    } else {
      const auto v = random_vec<float>(n, 100 + i);
      for (float x : v) g.sq += double(x) * x;
      g.f32.push_back(std::make_unique<DeviceBuffer<float>>(v));
      g.spans.push_back({g.f32.back()->get(), n, false});
    }
  }
  return g;
}

std::vector<float> run(const std::vector<cuda::GradSpan>& spans, float max_norm) {
  DeviceBuffer<float> out(2), ws(cuda::grad_norm_workspace_floats(spans.size()));
  cuda::grad_norm_coef(spans, max_norm, out.get(), ws.get(), nullptr);
  return out.to_host();
}

TEST(GradNormCuda, MatchesF64OverManyTensors) {
  LOOM_REQUIRE_GPU();
  for (int count : {1, 5, 64, 65, 200}) {
    const Grads g = make_grads(count);
    const double norm = std::sqrt(g.sq);
    for (float max_norm : {1.f, float(0.5 * norm), 1e9f}) {
      const std::vector<float> got = run(g.spans, max_norm);
      // f32 sums of up to ~1.5M squares of values in [-1, 1]: relative error well under 1e-5.
      EXPECT_NEAR(got[0], norm, 1e-5 * norm) << count << " tensors";
      const double coef = std::min(1.0, max_norm / (norm + 1e-6));
      EXPECT_NEAR(got[1], coef, 1e-5 * coef) << count << " tensors, max_norm " << max_norm;
    }
    EXPECT_EQ(run(g.spans, 1e9f)[1], 1.f);  // exactly 1 when not clipping
    EXPECT_EQ(run(g.spans, 1.f), run(g.spans, 1.f)) << "the same bits run to run";
  }
}

TEST(GradNormCuda, NanAndNoGradient) {
  LOOM_REQUIRE_GPU();
  DeviceBuffer<float> bad(std::vector<float>{1.f, std::numeric_limits<float>::quiet_NaN()});
  const std::vector<float> got = run({{bad.get(), 2, false}}, 1.f);
  EXPECT_TRUE(std::isnan(got[0]));
  EXPECT_TRUE(std::isnan(got[1]));  // as torch.clamp(nan, max=1)
  const std::vector<float> none = run({}, 1.f);
  EXPECT_EQ(none[0], 0.f);
  EXPECT_EQ(none[1], 1.f);
}

}  // namespace
}  // namespace loom::test
