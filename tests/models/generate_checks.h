// Shared by test_generate.cpp and test_generate_cuda.cpp: a KV-cached run (prefill, then one
// token at a time) must give the logits of the full forward pass at every position.
#pragma once
#include <cmath>

#include "models/generate.h"
#include "tests/models/fixtures.h"

namespace loom::test {

inline void check_cached_matches_full(const std::string& variant, Device device, double tol) {
  auto model = CausalLM::load(fixture_dir(variant), {DType::f32, device});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<int32_t> ids = read_all(fixture_dir(variant) + "/inputs.safetensors")["input_ids"].to_ints();
  ids.resize(12);  // the first row
  ag::NoGradGuard ng;
  // LongRoPE picks its factors by the length so far (transformers too): while decoding stays within
  // original_max_position_embeddings a step equals the full pass over its prefix; past it, new keys
  // use the long factors while the cache keeps the short-factor ones (as in transformers' generate),
  // which no single full pass reproduces, so those steps are only checked to be finite.
  const RopeParams& rope = (*model)->config().rope;
  if (rope.scaling.kind == RopeScaling::Kind::kLongRope) {
    CausalLM::KvCache cache = (*model)->make_cache(16);
    for (int s = 0; s < 12; ++s) {
      Tensor step = (*model)->forward_cached(Tensor::from_ints({ids[s]}, {1, 1}), cache).value();
      Tensor prefix = (*model)->forward(Tensor::from_ints({ids.begin(), ids.begin() + s + 1}, {1, s + 1})).value();
      if (rope.uses_long_factors(s)) {
        for (float v : step.to_floats()) ASSERT_TRUE(std::isfinite(v)) << variant << " position " << s;
      } else {
        EXPECT_LT(rel_err(step, prefix.narrow(1, s, 1).contiguous()), tol) << variant << " decode position " << s;
      }
    }
    return;
  }
  Tensor full = (*model)->forward(Tensor::from_ints(ids, {1, 12})).value();
  CausalLM::KvCache cache = (*model)->make_cache(16);
  const int prefill = 5;
  Tensor first = (*model)->forward_cached(Tensor::from_ints({ids.begin(), ids.begin() + prefill}, {1, prefill}), cache,
                                          /*all_positions=*/true)
                      .value();
  EXPECT_LT(rel_err(first, full.narrow(1, 0, prefill).contiguous()), tol) << variant << " prefill";
  for (int s = prefill; s < 12; ++s) {
    Tensor step = (*model)->forward_cached(Tensor::from_ints({ids[s]}, {1, 1}), cache).value();
    EXPECT_LT(rel_err(step, full.narrow(1, s, 1).contiguous()), tol) << variant << " decode position " << s;
  }
  EXPECT_EQ(cache.length, 12);
}

}  // namespace loom::test
