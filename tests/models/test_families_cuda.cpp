// Every family on CUDA against the transformers/PEFT references, in f32 and in bf16.
#include "tests/models/family_checks.h"

namespace loom::test {
namespace {

// f32 on CUDA: cuBLASLt without TF32 and the CUDA kernels differ from the CPU only in summation
// order and a few ulp of expf/tanhf: 1e-4 on logits and gradients.
constexpr Tolerances kF32{1e-4, 2e-5, 1e-4, 1e-4};
// bf16 weights and activations: bounded by PyTorch's own bf16 error on the same fixture (see
// family_checks.h), not by a fixed number.
constexpr Tolerances kBf16{0, 0, 0, 0, true};

class FamilyCuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(FamilyCuda, BaseF32) { check_base_logits(GetParam(), {DType::f32, Device::cuda(0)}, kF32); }
TEST_P(FamilyCuda, BaseBf16) { check_base_logits(GetParam(), {DType::bf16, Device::cuda(0)}, kBf16); }
TEST_P(FamilyCuda, LoraF32) { check_lora(GetParam(), {DType::f32, Device::cuda(0)}, kF32); }
TEST_P(FamilyCuda, LoraBf16) { check_lora(GetParam(), {DType::bf16, Device::cuda(0)}, kBf16); }
TEST_P(FamilyCuda, FusedLossF32) { check_fused_loss(GetParam(), {DType::f32, Device::cuda(0)}, kF32); }
TEST_P(FamilyCuda, FusedLossBf16) { check_fused_loss(GetParam(), {DType::bf16, Device::cuda(0)}, kBf16); }
TEST_P(FamilyCuda, MergedF32) { check_merged(GetParam(), {DType::f32, Device::cuda(0)}, kF32); }

INSTANTIATE_TEST_SUITE_P(Fixtures, FamilyCuda, ::testing::ValuesIn(fixture_variants()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace loom::test
