// KV-cached decoding on CUDA reproduces the full forward pass for every family.
#include "tests/models/generate_checks.h"

namespace loom::test {
namespace {

class GenerateCuda : public ::testing::TestWithParam<std::string> {};

// f32 on CUDA: summation order and fast expf in the decode kernel: 1e-4.
TEST_P(GenerateCuda, CachedDecodingMatchesFullForward) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  check_cached_matches_full(GetParam(), Device::cuda(0), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GenerateCuda, ::testing::ValuesIn(fixture_variants()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace loom::test
