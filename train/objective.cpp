// The objectives of objective.h.
#include "train/objective.h"

#include "absl/strings/str_cat.h"
#include "models/lora.h"

namespace loom {
namespace {

// Supervised fine-tuning: the mean next-token cross-entropy over the tokens marked as targets.
class Sft final : public Objective {
 public:
  std::string name() const override { return "sft"; }
  int64_t units(const Batch& batch) const override { return batch.target_tokens; }
  ag::Variable loss(CausalLM& model, const DeviceBatch& b) override {
    // Fused lm_head + loss: the [tokens, vocab] logits never exist (labels were shifted on the host).
    return model.loss_from_targets(b.input_ids, b.targets, {b.positions, b.segment_ids, b.max_position});
  }
};

// A preference loss over a batch of pairs (rows [0, P) chosen, [P, 2P) rejected): both sides'
// log-probabilities in one forward, the reference's (dpo/ipo) in a second one without gradients and
// with the adapters off, and the loss of preference_loss.h, whose mean is over the batch's pairs.
class Preference final : public Objective {
 public:
  explicit Preference(const PreferenceParams& p) : params_(p) {}
  std::string name() const override { return preference_name(params_.kind); }
  int64_t units(const Batch& batch) const override { return batch.pairs; }
  ag::Variable loss(CausalLM& model, const DeviceBatch& b) override {
    LOOM_CHECK(b.pairs > 0 && b.input_ids.size(0) == 2 * b.pairs, "preference objective: the batch is not pairs");
    const ForwardOptions fwd{b.positions, Tensor(), b.max_position};  // right padding: no segment mask needed
    std::vector<ag::Variable> all = model.sequence_logps(b.input_ids, b.host_targets, fwd);
    PairScores s;
    s.chosen.assign(all.begin(), all.begin() + b.pairs);
    s.rejected.assign(all.begin() + b.pairs, all.end());
    const int64_t seq = b.input_ids.size(1);
    const std::vector<int32_t> t = b.host_targets.to_ints();
    for (int64_t r = 0; r < 2 * b.pairs; ++r) {
      int64_t n = 0;
      for (int64_t j = 0; j < seq; ++j) n += t[r * seq + j] != ops::kIgnoreIndex;
      (r < b.pairs ? s.chosen_tokens : s.rejected_tokens).push_back(n);
    }
    if (needs_reference(params_.kind)) {
      ag::NoGradGuard ng;
      AdaptersOff off(model);
      std::vector<ag::Variable> ref = model.sequence_logps(b.input_ids, b.host_targets, fwd);
      for (int64_t r = 0; r < 2 * b.pairs; ++r)
        (r < b.pairs ? s.ref_chosen : s.ref_rejected).push_back(static_cast<double>(ref[r].value().item()));
    }
    auto res = preference_loss(s, params_);
    LOOM_CHECK(res.ok(), res.status().message());
    last_ = res->metrics;
    return res->loss;
  }
  std::vector<std::pair<std::string, double>> metrics() const override {
    std::vector<std::pair<std::string, double>> m = {
        {"rewards/chosen", last_.rewards_chosen}, {"rewards/rejected", last_.rewards_rejected},
        {"rewards/accuracies", last_.accuracy},   {"rewards/margins", last_.margin},
        {"logps/chosen", last_.logps_chosen},     {"logps/rejected", last_.logps_rejected}};
    if (params_.kind == PreferenceKind::kOrpo) {
      m.emplace_back("nll_loss", last_.nll_loss);
      m.emplace_back("log_odds_ratio", last_.log_odds_ratio);
    }
    return m;
  }

 private:
  PreferenceParams params_;
  PreferenceMetrics last_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Objective>> make_objective(const std::string& name, const PreferenceParams& params) {
  if (name == "sft") return std::make_unique<Sft>();
  if (auto kind = parse_preference_kind(name); kind.ok()) {
    PreferenceParams p = params;
    p.kind = *kind;
    return std::make_unique<Preference>(p);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown objective '", name, "' (there is: sft, dpo, ipo, simpo, orpo)"));
}

}  // namespace loom
