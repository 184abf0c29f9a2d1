// Generation: KV-cached decoding reproduces the full forward pass for every family (GQA, sliding
// windows, soft-capping), and sampling is greedy at temperature 0 and seeded otherwise.
#include "tests/models/generate_checks.h"

namespace loom::test {
namespace {

class Generate : public ::testing::TestWithParam<std::string> {};

// f32 on both paths; the decode kernel sums in a different order than the full attention: 1e-5.
TEST_P(Generate, CachedDecodingMatchesFullForward) { check_cached_matches_full(GetParam(), Device::cpu(), 1e-5); }

INSTANTIATE_TEST_SUITE_P(Fixtures, Generate, ::testing::ValuesIn(fixture_variants()),
                         [](const auto& info) { return info.param; });

TEST(Sampling, GreedyTopPAndSeeds) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f};
  uint64_t rng = 1;
  EXPECT_EQ(sample_token(logits, 0.f, 1.f, &rng), 1);
  // top_p tiny: only the most likely token survives.
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sample_token(logits, 1.f, 1e-6f, &rng), 1);
  // top_p 0.6 at temperature 1 keeps tokens 1 and 3 (masses 0.42 + 0.38 > 0.6) and never others.
  int seen[5] = {};
  for (int i = 0; i < 2000; ++i) ++seen[sample_token(logits, 1.f, 0.6f, &rng)];
  EXPECT_EQ(seen[0] + seen[2] + seen[4], 0);
  EXPECT_GT(seen[1], 800);
  EXPECT_GT(seen[3], 700);
  uint64_t a = 7, b = 7;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits, 0.8f, 0.95f, &a), sample_token(logits, 0.8f, 0.95f, &b));
}

TEST(Generate, StopsAtStopTokenAndRespectsLength) {
  auto model = CausalLM::load(fixture_dir("llama"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok());
  GenerateOptions opt;
  opt.temperature = 0.f;
  opt.max_new_tokens = 6;
  const auto out = generate(**model, {1, 2, 3}, opt);
  ASSERT_EQ(out.size(), 6u);
  opt.stop_ids = {out[2]};
  const auto stopped = generate(**model, {1, 2, 3}, opt);
  EXPECT_LE(stopped.size(), 3u);
  EXPECT_EQ(stopped.back(), out[2]);
}

}  // namespace
}  // namespace loom::test
