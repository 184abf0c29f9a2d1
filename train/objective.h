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

// The reference's log-probability of each pair's chosen and rejected completion, by the pair's
// index in the training data (Batch::pair_ids): --precompute-ref's table.
struct ReferenceLogps {
  std::vector<double> chosen, rejected;
};

class Objective {
 public:
  virtual ~Objective() = default;
  virtual std::string name() const = 0;
  // The units the step's loss is a mean over, counted in a host batch (SFT: its target tokens). A
  // step weighs each micro-batch's loss by its share of the step's units (over every rank), so the
  // loss of a step does not depend on how its rows are split into micro-batches or over ranks.
  virtual int64_t units(const Batch& batch) const = 0;
  // Before a step's (or an evaluation's) micro-batches: all of them, whole (before they are sliced
  // over ranks). An objective whose loss is not a plain mean over units (orpo's NLL is a mean over
  // chosen tokens) reads the totals it needs here.
  virtual void begin_step(const std::vector<Batch>& /*global*/) {}
  // The mean loss over the micro-batch's units: a scalar on the batch's device, to backpropagate.
  // Never called on a batch with no units. The model is not changed (a preference objective turns
  // its adapters off for the reference and back on).
  virtual ag::Variable loss(CausalLM& model, const DeviceBatch& batch) = 0;
  // What the last loss() measured besides the loss, under the names metrics.jsonl gives them
  // (TRL's "rewards/chosen", ...), each a mean over that micro-batch's units; none for SFT.
  virtual std::vector<std::pair<std::string, double>> metrics() const { return {}; }
  // The same for measures still on the device (f32 scalars, each a mean over the micro-batch's
  // units): the trainer sums them there, weighted, and reads them back with the step's loss, so
  // measuring adds no wait for the GPU per micro-batch (SFT's aux_loss).
  virtual std::vector<std::pair<std::string, Tensor>> device_metrics() const { return {}; }

  // Mixture-of-experts models: the load-balancing loss of the forward (SFT: every token; preference
  // objectives: the policy's tokens of both sides, padding left out) joins the loss times `coef` (0: it
  // is only measured), and device_metrics() reports it as "aux_loss".
  virtual void set_router_aux_loss(double /*coef*/) {}

  // Whether loss() scores its batch under a reference model too (dpo, ipo).
  virtual bool uses_reference() const { return false; }
  // Where the reference's scores come from, when loss() needs them. By default the model itself with
  // its adapters off (a LoRA policy's reference, no second copy). A frozen model (--full: the
  // weights as they were before training) instead, not owned; or a table computed once before
  // training (--precompute-ref), read by Batch::pair_ids, which a batch must then carry.
  virtual void set_reference_model(CausalLM* /*frozen*/) {}
  virtual void set_reference_logps(std::shared_ptr<const ReferenceLogps> /*table*/) {}
};

// Scores every pair of `batches` under the reference of `objective`'s kind, in no-grad forwards on
// `device`, as the training steps would (adapters off, or `frozen` when given): the table of
// --precompute-ref for pairs 0..pairs-1. With `dist`, each rank scores the batches i with
// i % world == rank and the table is summed over the ranks.
class DistContext;
absl::StatusOr<ReferenceLogps> score_reference(CausalLM& model, CausalLM* frozen, const std::vector<Batch>& batches,
                                               int64_t pairs, Device device, DistContext* dist);

// "sft": next-token cross-entropy over the target tokens (fused lm_head + loss, never the
// [tokens, vocab] logits). "dpo", "ipo", "simpo", "orpo": train/preference_loss.h over batches of
// pairs (PairLoader), with `params`; dpo and ipo take the model with its adapters off as the
// reference. Anything else is an InvalidArgument naming the objectives there are.
absl::StatusOr<std::unique_ptr<Objective>> make_objective(const std::string& name, const PreferenceParams& params = {});

}  // namespace loom
