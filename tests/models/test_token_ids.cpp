// Out-of-range token ids and targets are an error on every device: ids that come from host memory
// are checked there before upload (check_token_ids), so the CPU and the CUDA kernels (which only
// zero such a row) never disagree. The CUDA half is test_token_ids_cuda.cpp.
#include <gtest/gtest.h>

#include "kernels/cross_entropy.h"
#include "kernels/error.h"
#include "models/causal_lm.h"
#include "tests/models/fixtures.h"

namespace loom {
namespace {

TEST(TokenIds, OutOfRangeIsAnErrorNamingThePosition) {
  auto model = CausalLM::load(test::fixture_dir("qwen2"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t vocab = (*model)->config().vocab_size;
  const Tensor bad_ids = Tensor::from_ints({1, 2, static_cast<int32_t>(vocab), 3}, {1, 4});
  try {
    (*model)->forward(bad_ids);
    FAIL() << "an id equal to vocab_size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input_ids[2] = " + std::to_string(vocab) + " is outside the model's vocabulary"),
              std::string::npos)
        << e.what();
  }
  const Tensor ids = Tensor::from_ints({1, 2, 3, 4}, {1, 4});
  const Tensor bad_targets = Tensor::from_ints({2, -5, 4, ops::kIgnoreIndex}, {4});
  EXPECT_THROW((*model)->loss_from_targets(ids, bad_targets), Error);
  const Tensor ok_targets = Tensor::from_ints({2, 3, 4, ops::kIgnoreIndex}, {4});
  EXPECT_NO_THROW((*model)->loss_from_targets(ids, ok_targets));
  EXPECT_FALSE(check_token_ids(bad_targets, vocab, true, "targets").ok());
  EXPECT_TRUE(check_token_ids(ok_targets, vocab, true, "targets").ok());
  EXPECT_FALSE(check_token_ids(ok_targets, vocab, false, "ids").ok());  // -100 is no token id
}

}  // namespace
}  // namespace loom
