// The objectives of objective.h.
#include "train/objective.h"

#include "absl/strings/str_cat.h"

namespace loom {
namespace {

// Supervised fine-tuning: the mean next-token cross-entropy over the tokens marked as targets.
class Sft final : public Objective {
 public:
  std::string name() const override { return "sft"; }
  int64_t units(const Batch& batch) const override { return batch.target_tokens; }
  ag::Variable loss(const CausalLM& model, const DeviceBatch& b) const override {
    // Fused lm_head + loss: the [tokens, vocab] logits never exist (labels were shifted on the host).
    return model.loss_from_targets(b.input_ids, b.targets, {b.positions, b.segment_ids, b.max_position});
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Objective>> make_objective(const std::string& name) {
  if (name == "sft") return std::make_unique<Sft>();
  return absl::InvalidArgumentError(absl::StrCat("unknown objective '", name, "' (there is: sft)"));
}

}  // namespace loom
