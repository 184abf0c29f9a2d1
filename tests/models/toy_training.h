// Shared by the ToyLlama training tests: a fixed learnable batch and a loop returning losses.
#pragma once
#include <vector>

#include "models/toy_llama.h"

namespace loom::test {

struct ToyBatch {
  Tensor ids, targets;
};

// Sequences counting upward by a per-row stride modulo the vocabulary (targets = next token).
inline ToyBatch toy_batch(const ToyLlamaConfig& c, int64_t batch, int64_t seq, Device device) {
  std::vector<int32_t> ids, targets;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s) {
      ids.push_back(static_cast<int32_t>((b * 5 + s * (b + 2)) % c.vocab_size));
      targets.push_back(s + 1 < seq ? static_cast<int32_t>((b * 5 + (s + 1) * (b + 2)) % c.vocab_size) : -100);
    }
  return {Tensor::from_ints(ids, {batch, seq}).to(device), Tensor::from_ints(targets, {batch, seq}).to(device)};
}

inline std::vector<float> train_losses(ToyLlama& model, const ToyBatch& b, int steps, float lr = 1e-2f) {
  AdamWParams p;
  p.lr = lr;
  p.weight_decay = 0.01f;
  std::vector<float> losses;
  for (int i = 0; i < steps; ++i) {
    ag::Variable loss = model.loss(b.ids, b.targets);
    losses.push_back(loss.value().item());
    ag::backward(loss);
    model.step(p);
  }
  return losses;
}

}  // namespace loom::test
