// Generation with a KV cache (see generate.h).
#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/splitmix64.h"

namespace loom {

int32_t sample_token(const std::vector<float>& logits, float temperature, float top_p, uint64_t* rng) {
  LOOM_CHECK(!logits.empty(), "sample_token: empty logits");
  if (temperature <= 0.f) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < p.size(); ++i) total += p[i] = std::exp(static_cast<double>((logits[i] - mx) / temperature));
  std::vector<int32_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  // Nucleus: the smallest prefix whose mass reaches top_p (at least one token).
  size_t keep = 0;
  double mass = 0;
  while (keep < order.size() && (keep == 0 || mass < top_p * total)) mass += p[order[keep++]];
  const double u = static_cast<double>(splitmix64(rng) >> 11) * 0x1.0p-53 * mass;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[order[i]];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

std::vector<int32_t> generate(const CausalLM& model, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                              const std::function<void(int32_t)>& on_token) {
  LOOM_CHECK(!prompt.empty(), "generate: the prompt is empty");
  if (opt.max_new_tokens <= 0) return {};
  const int64_t capacity =
      std::min<int64_t>(static_cast<int64_t>(prompt.size()) + opt.max_new_tokens, model.config().max_position_embeddings);
  LOOM_CHECK(static_cast<int64_t>(prompt.size()) < capacity, "generate: the prompt (", prompt.size(),
             " tokens) leaves no room under max_position_embeddings ", model.config().max_position_embeddings);
  CausalLM::KvCache cache = model.make_cache(capacity);
  uint64_t rng = opt.seed;
  std::vector<int32_t> out;
  Tensor ids = Tensor::from_ints(prompt, {1, static_cast<int64_t>(prompt.size())});
  while (static_cast<int64_t>(out.size()) < opt.max_new_tokens && cache.length < capacity) {
    ag::Variable logits = model.forward_cached(ids, cache);
    const int64_t n = logits.size(1), vocab = logits.size(2);
    const std::vector<float> last = logits.value().select(1, n - 1).reshape({vocab}).to_floats();
    const int32_t next = sample_token(last, opt.temperature, opt.top_p, &rng);
    out.push_back(next);
    if (on_token) on_token(next);
    if (std::find(opt.stop_ids.begin(), opt.stop_ids.end(), next) != opt.stop_ids.end()) break;
    ids = Tensor::from_ints({next}, {1, 1});
  }
  return out;
}

}  // namespace loom
