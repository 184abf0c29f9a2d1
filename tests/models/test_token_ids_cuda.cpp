// The CUDA side of test_token_ids.cpp: a model on the GPU given host ids or targets outside the
// vocabulary reports the same error as the CPU (checked before the upload), instead of the
// kernels zeroing the row and counting the target in the mean.
#include <gtest/gtest.h>

#include "kernels/cross_entropy.h"
#include "kernels/error.h"
#include "models/causal_lm.h"
#include "tests/models/fixtures.h"

namespace loom {
namespace {

TEST(TokenIdsCuda, OutOfRangeIsTheSameErrorAsOnTheCpu) {
  for (const Device device : {Device::cpu(), Device::cuda(0)}) {
    SCOPED_TRACE(device.str());
    auto model = CausalLM::load(test::fixture_dir("qwen2"), {DType::f32, device});
    ASSERT_TRUE(model.ok()) << model.status();
    const int64_t vocab = (*model)->config().vocab_size;
    const Tensor ids = Tensor::from_ints({1, 2, 3, 4}, {1, 4});
    std::string messages[2];
    try {
      (*model)->forward(Tensor::from_ints({1, 2, static_cast<int32_t>(vocab) + 7, 3}, {1, 4}));
    } catch (const Error& e) {
      messages[0] = e.what();
    }
    try {
      (*model)->loss_from_targets(ids, Tensor::from_ints({2, static_cast<int32_t>(vocab), 4, ops::kIgnoreIndex}, {4}));
    } catch (const Error& e) {
      messages[1] = e.what();
    }
    EXPECT_NE(messages[0].find("input_ids[2] = " + std::to_string(vocab + 7)), std::string::npos) << messages[0];
    EXPECT_NE(messages[1].find("targets[1] = " + std::to_string(vocab)), std::string::npos) << messages[1];
  }
}

}  // namespace
}  // namespace loom
