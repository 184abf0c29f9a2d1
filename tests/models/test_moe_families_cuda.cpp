// The MoE families on CUDA against the transformers + PEFT references (tests/models/moe_checks.h):
// f32 to summation order, bf16 within bf16 rounding.
#include "tests/models/moe_checks.h"

namespace loom::test {
namespace {

class MoeFamilyCuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(MoeFamilyCuda, LogitsLossAndLoadBalancingLossF32) { check_moe_forward(GetParam(), Device::cuda(0), 1e-4); }
TEST_P(MoeFamilyCuda, LoraOnAttentionAndExpertsF32) { check_moe_lora(GetParam(), Device::cuda(0), 1e-4); }
TEST_P(MoeFamilyCuda, Bf16IsCloseToPeft) { check_moe_bf16(GetParam(), Device::cuda(0)); }

INSTANTIATE_TEST_SUITE_P(Fixtures, MoeFamilyCuda, ::testing::ValuesIn(moe_variants()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace loom::test
