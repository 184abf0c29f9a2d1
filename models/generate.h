// Text generation with a KV cache: greedy or temperature / top-p sampling from a seeded,
// platform-independent generator.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "models/causal_lm.h"

namespace loom {

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  float temperature = 0.7f;  // 0 = greedy
  float top_p = 0.9f;
  uint64_t seed = 0;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
};

// Returns the new tokens (not the prompt); on_token, if set, sees each as it is produced.
std::vector<int32_t> generate(const CausalLM& model, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                              const std::function<void(int32_t)>& on_token = {});

// Picks a token from one row of logits (exposed for tests).
int32_t sample_token(const std::vector<float>& logits, float temperature, float top_p, uint64_t* rng_state);

}  // namespace loom
