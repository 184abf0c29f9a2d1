// The objectives of objective.h.
#include "train/objective.h"

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "models/lora.h"
#include "train/distributed.h"

namespace loom {
namespace {

// The load-balancing loss of a mixture-of-experts model's forward, once set_router_aux_loss asked for
// it: requested from the forward, added to a loss times its coefficient, reported on the device.
struct RouterAux {
  bool measure = false;
  double coef = 0;
  ag::Variable value;

  // Asks the forward of `opt` for it, over `spans` (empty: every token).
  void request(ForwardOptions& opt, std::vector<TokenSpan> spans = {}) {
    value = ag::Variable();
    if (!measure) return;
    opt.aux_loss = &value;
    opt.aux_spans = std::move(spans);
  }
  // loss + coef * aux, when both are there.
  ag::Variable added_to(const ag::Variable& loss) const { return measure ? add_load_balancing(loss, value, coef) : loss; }
  // "aux_loss" on the device; 0 when the model routed nothing (no MoE layer ran).
  std::vector<std::pair<std::string, Tensor>> metrics() const {
    if (!measure) return {};
    return {{"aux_loss", value.defined() ? value.value().to(DType::f32) : Tensor::zeros({}, DType::f32)}};
  }
};

// A batch's forward options: its positions and largest position, and `segment_ids` (the batch's or none).
ForwardOptions options_of(const DeviceBatch& b, const Tensor& segment_ids) {
  ForwardOptions opt;
  opt.positions = b.positions, opt.segment_ids = segment_ids, opt.max_position = b.max_position;
  return opt;
}

// Supervised fine-tuning: the mean next-token cross-entropy over the tokens marked as targets.
class Sft final : public Objective {
 public:
  std::string name() const override { return "sft"; }
  int64_t units(const Batch& batch) const override { return batch.target_tokens; }
  ag::Variable loss(CausalLM& model, const DeviceBatch& b) override {
    // Fused lm_head + loss: the [tokens, vocab] logits never exist (labels were shifted on the host).
    ForwardOptions opt = options_of(b, b.segment_ids);
    aux_.request(opt, b.unpadded);  // the padding that ends a packed row has no say in it
    return aux_.added_to(model.loss_from_targets(b.input_ids, b.targets, opt));
  }
  void set_router_aux_loss(double coef) override { aux_.measure = true, aux_.coef = coef; }
  // On the device (read with the step's loss).
  std::vector<std::pair<std::string, Tensor>> device_metrics() const override { return aux_.metrics(); }

 private:
  RouterAux aux_;
};

// A batch of pairs' forward: positions, and the segment ids when rows pack several sequences (right
// padding alone needs no mask).
ForwardOptions forward_options(const DeviceBatch& b) { return options_of(b, b.packed ? b.segment_ids : Tensor()); }

// Each sequence's positions: Batch::seq_start / seq_len, chosen sides first.
std::vector<CausalLM::Span> spans(const DeviceBatch& b) {
  LOOM_CHECK(static_cast<int64_t>(b.seq_start.size()) == 2 * b.pairs && b.seq_len.size() == b.seq_start.size(),
             "preference objective: a batch of ", b.pairs, " pairs with ", b.seq_start.size(), " sequence spans");
  std::vector<CausalLM::Span> out;
  for (size_t i = 0; i < b.seq_start.size(); ++i) out.push_back({b.seq_start[i], b.seq_len[i]});
  return out;
}

// The reference's log-probability of each sequence's completion (rows [0, P) chosen, [P, 2P) rejected):
// `frozen` when given, else the model with its adapters off; no gradient either way.
std::vector<double> reference_logps(CausalLM& model, CausalLM* frozen, const DeviceBatch& b) {
  ag::NoGradGuard ng;
  std::vector<ag::Variable> ref;
  if (frozen) {
    ref = frozen->sequence_logps(b.input_ids, b.host_targets, forward_options(b), spans(b));
  } else {
    AdaptersOff off(model);
    ref = model.sequence_logps(b.input_ids, b.host_targets, forward_options(b), spans(b));
  }
  std::vector<double> out;
  for (const ag::Variable& v : ref) out.push_back(static_cast<double>(v.value().item()));
  return out;
}

// A preference loss over a batch of pairs (rows [0, P) chosen, [P, 2P) rejected): both sides'
// log-probabilities in one forward, the reference's (dpo/ipo) in a second one without gradients and
// with the adapters off, and the loss of preference_loss.h, whose mean is over the batch's pairs. A
// mixture-of-experts policy adds the load-balancing loss of that forward over both sides' tokens
// (their padding left out) times its coefficient, as TRL's DPOTrainer adds outputs.aux_loss of its
// concatenated chosen + rejected batch; the reference's forward has none.
class Preference final : public Objective {
 public:
  explicit Preference(const PreferenceParams& p) : params_(p) {}
  std::string name() const override { return preference_name(params_.kind); }
  int64_t units(const Batch& batch) const override { return batch.pairs; }
  ag::Variable loss(CausalLM& model, const DeviceBatch& b) override {
    LOOM_CHECK(b.pairs > 0, "preference objective: the batch is not pairs");
    const std::vector<CausalLM::Span> seqs = spans(b);
    ForwardOptions opt = forward_options(b);
    aux_.request(opt, seqs);
    std::vector<ag::Variable> all = model.sequence_logps(b.input_ids, b.host_targets, opt, seqs);
    PairScores s;
    s.chosen.assign(all.begin(), all.begin() + b.pairs);
    s.rejected.assign(all.begin() + b.pairs, all.end());
    const std::vector<int32_t> t = b.host_targets.to_ints();
    for (int64_t r = 0; r < 2 * b.pairs; ++r) {
      int64_t n = 0;
      for (int64_t j = seqs[r].start; j < seqs[r].start + seqs[r].length; ++j) n += t[j] != ops::kIgnoreIndex;
      (r < b.pairs ? s.chosen_tokens : s.rejected_tokens).push_back(n);
    }
    if (needs_reference(params_.kind)) {
      if (table_) {
        LOOM_CHECK(static_cast<int64_t>(b.pair_ids.size()) == b.pairs, "preference objective: a batch without pair ids");
        for (int64_t id : b.pair_ids) {
          LOOM_CHECK(id >= 0 && id < static_cast<int64_t>(table_->chosen.size()), "preference objective: pair ", id,
                     " is past the reference table's ", table_->chosen.size());
          s.ref_chosen.push_back(table_->chosen[id]), s.ref_rejected.push_back(table_->rejected[id]);
        }
      } else {
        const std::vector<double> ref = reference_logps(model, frozen_, b);
        s.ref_chosen.assign(ref.begin(), ref.begin() + b.pairs);
        s.ref_rejected.assign(ref.begin() + b.pairs, ref.end());
      }
    }
    if (step_pairs_ > 0)  // this micro-batch's share of the step's chosen tokens (PairScores::nll_denominator)
      s.nll_denominator = static_cast<double>(step_chosen_) * static_cast<double>(b.pairs) / static_cast<double>(step_pairs_);
    auto res = preference_loss(s, params_);
    LOOM_CHECK(res.ok(), res.status().message());
    last_ = res->metrics;
    return aux_.added_to(res->loss);
  }
  void set_router_aux_loss(double coef) override { aux_.measure = true, aux_.coef = coef; }
  std::vector<std::pair<std::string, Tensor>> device_metrics() const override { return aux_.metrics(); }
  void begin_step(const std::vector<Batch>& global) override {
    step_pairs_ = step_chosen_ = 0;
    for (const Batch& g : global) {  // the chosen sides' targets: labels past each sequence's first token
      step_pairs_ += g.pairs;
      const std::vector<int32_t> l = g.labels.to_ints();
      for (int64_t r = 0; r < g.pairs; ++r)
        for (int64_t j = g.seq_start[r] + 1; j < g.seq_start[r] + g.seq_len[r]; ++j) step_chosen_ += l[j] != ops::kIgnoreIndex;
    }
  }
  bool uses_reference() const override { return needs_reference(params_.kind); }
  void set_reference_model(CausalLM* frozen) override { frozen_ = frozen; }
  void set_reference_logps(std::shared_ptr<const ReferenceLogps> table) override { table_ = std::move(table); }
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
  CausalLM* frozen_ = nullptr;
  int64_t step_pairs_ = 0, step_chosen_ = 0;  // begin_step's totals (0: none given)
  std::shared_ptr<const ReferenceLogps> table_;
  RouterAux aux_;
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

absl::StatusOr<ReferenceLogps> score_reference(CausalLM& model, CausalLM* frozen, const std::vector<Batch>& batches,
                                               int64_t pairs, Device device, DistContext* dist) {
  ReferenceLogps t;
  t.chosen.assign(pairs, 0.0), t.rejected.assign(pairs, 0.0);
  const int64_t world = dist ? dist->world() : 1, rank = dist ? dist->rank() : 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    if (static_cast<int64_t>(i) % world != rank) continue;
    std::vector<DeviceBatch> d;
    LOOM_ASSIGN_OR_RETURN(d, upload({batches[i]}, device, model.config().vocab_size));
    const std::vector<double> ref = reference_logps(model, frozen, d[0]);
    const int64_t P = batches[i].pairs;
    for (int64_t k = 0; k < P; ++k) {
      const int64_t id = batches[i].pair_ids[k];
      if (id < 0 || id >= pairs) return absl::InternalError(absl::StrCat("score_reference: pair ", id, " of ", pairs));
      t.chosen[id] = ref[k], t.rejected[id] = ref[P + k];
    }
  }
  if (dist) dist->sum(t.chosen), dist->sum(t.rejected);
  return t;
}

}  // namespace loom
