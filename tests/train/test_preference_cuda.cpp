// The preference forward on CUDA against TRL (see test_preference.cpp): in f32 as on the CPU, and in
// bf16 within what bf16 rounding of the weights and activations moves (two layers, 3 pairs).
#include "tests/train/preference_checks.h"

namespace loom::test {
namespace {

TEST(PreferenceTrlCuda, F32MatchesTrl) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  check_against_trl(Device::cuda(0), DType::f32, 2e-5, 1e-4);
}

TEST(PreferenceTrlCuda, Bf16IsCloseToTrl) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  check_against_trl(Device::cuda(0), DType::bf16, 3e-2, 1.5e-1);
}

}  // namespace
}  // namespace loom::test
