// check_finite_to_save on CUDA tensors: one multi-tensor sum of squares per device decides that a
// save is clean; a non-finite one (NaN, infinity, or finite values whose squares overflow) falls back
// to the tensor-by-tensor check, which names the first bad tensor and element as on the CPU.
#include <cmath>
#include <limits>

#include "models/finite_check.h"
#include "tests/models/fixtures.h"

namespace loom::test {
namespace {

class NonfiniteCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

std::vector<std::pair<std::string, Tensor>> many_finite() {
  std::vector<std::pair<std::string, Tensor>> out;
  for (int i = 0; i < 40; ++i) {
    const DType dt = i % 2 ? DType::bf16 : DType::f32;
    out.emplace_back("t" + std::to_string(i), Tensor::full({17, 5 + i}, 0.5f + i, dt).to(Device::cuda(0)));
  }
  out.emplace_back("ids", Tensor::from_ints({1, 2}, {2}));  // not a float tensor: never checked
  out.emplace_back("host", Tensor::full({3}, 2.f, DType::f32));
  return out;
}

TEST_F(NonfiniteCuda, ACleanSavePassesAndTheFirstBadTensorIsNamed) {
  auto ok = many_finite();
  EXPECT_TRUE(check_finite_to_save(ok, "x.safetensors").ok());

  // A NaN deep inside the 30th tensor (bf16) and an infinity in the 35th: the first is named.
  auto bad = ok;
  std::vector<double> v(17 * 35, 30.5);
  v[3 * 35 + 7] = std::numeric_limits<double>::quiet_NaN();
  bad[30].second = Tensor::from_doubles(v, {17, 35}).to(DType::bf16).to(Device::cuda(0));
  std::vector<double> w(17 * 40, 35.5);
  w[5] = INFINITY;
  bad[35].second = Tensor::from_doubles(w, {17, 40}).to(DType::f32).to(Device::cuda(0));
  const absl::Status s = check_finite_to_save(bad, "x.safetensors");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tensor 't30' holds nan at [3, 7] (element 112 of 595)"), std::string::npos) << s;
}

TEST_F(NonfiniteCuda, LargeFiniteValuesWhoseSquaresOverflowAreNotRefused) {
  auto big = many_finite();
  big[4].second = Tensor::full({8}, 3e38f, DType::f32).to(Device::cuda(0));  // sum of squares is inf
  big[5].second = Tensor::full({8}, -1e30f, DType::bf16).to(Device::cuda(0));
  EXPECT_TRUE(check_finite_to_save(big, "x.safetensors").ok());
  big[6].second = Tensor::full({8}, -INFINITY, DType::bf16).to(Device::cuda(0));
  const absl::Status s = check_finite_to_save(big, "x.safetensors");
  EXPECT_NE(s.message().find("tensor 't6' holds -inf at [0]"), std::string::npos) << s;
}

}  // namespace
}  // namespace loom::test
