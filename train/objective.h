// What a training step minimises. The trainer hands an Objective each micro-batch and gets back that
// micro-batch's loss; it never names an objective. SFT (the mean cross-entropy over the target
// tokens) is the one built today; the preference losses (DPO, IPO, SimPO, ORPO: per-pair log-
// probabilities of a policy against a reference) implement the same interface.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "autograd/variable.h"
#include "models/causal_lm.h"
#include "train/data.h"
#include "train/device_batch.h"
#include "train/preference_loss.h"

namespace loom {

class Objective {
 public:
  virtual ~Objective() = default;
  virtual std::string name() const = 0;
  // The units the step's loss is a mean over, counted in a host batch (SFT: its target tokens). A
  // step weighs each micro-batch's loss by its share of the step's units (over every rank), so the
  // loss of a step does not depend on how its rows are split into micro-batches or over ranks.
  virtual int64_t units(const Batch& batch) const = 0;
  // The mean loss over the micro-batch's units: a scalar on the batch's device, to backpropagate.
  // Never called on a batch with no units. The model is not changed (a preference objective turns
  // its adapters off for the reference and back on).
  virtual ag::Variable loss(CausalLM& model, const DeviceBatch& batch) = 0;
  // What the last loss() measured besides the loss, under the names metrics.jsonl gives them
  // (TRL's "rewards/chosen", ...), each a mean over that micro-batch's units; none for SFT.
  virtual std::vector<std::pair<std::string, double>> metrics() const { return {}; }
};

// "sft": next-token cross-entropy over the target tokens (fused lm_head + loss, never the
// [tokens, vocab] logits). "dpo", "ipo", "simpo", "orpo": train/preference_loss.h over batches of
// pairs (PairLoader), with `params`; dpo and ipo take the model with its adapters off as the
// reference. Anything else is an InvalidArgument naming the objectives there are.
absl::StatusOr<std::unique_ptr<Objective>> make_objective(const std::string& name, const PreferenceParams& params = {});

}  // namespace loom
