// The preference losses of `--objective dpo|ipo|simpo|orpo`, as TRL defines them, over one
// micro-batch of (chosen, rejected) pairs. With pi a completion's summed token log-probabilities
// under the policy, ref the same under the reference and avg = pi / its completion tokens:
//   dpo   (DPOTrainer "sigmoid", cDPO smoothing ls): x = beta ((pi_c - ref_c) - (pi_r - ref_r)),
//         loss = (1 - ls) softplus(-x) + ls softplus(x)
//   ipo   (DPOTrainer "ipo", length-normalised): h = (pi_c - ref_c)/n_c - (pi_r - ref_r)/n_r,
//         loss = (h - 1/(2 beta))^2
//   simpo (CPOTrainer "simpo"): x = beta (avg_c - avg_r) - gamma, loss as dpo's (no reference)
//   orpo  (ORPOTrainer): lo = (avg_c - avg_r) - (log(1 - e^avg_c) - log(1 - e^avg_r)),
//         loss = nll - beta mean(log sigmoid(lo)), nll = the chosen completions' mean token NLL
// each averaged over the pairs. The loss is one autograd node over the per-sequence log-probs
// (ag::host_scalar: a few scalars, in f64), so its gradient reaches the model through them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "autograd/variable.h"

namespace loom {

enum class PreferenceKind { kDpo, kIpo, kSimpo, kOrpo };
absl::StatusOr<PreferenceKind> parse_preference_kind(const std::string& name);  // "dpo", ...
const char* preference_name(PreferenceKind kind);
// dpo and ipo compare the policy with a reference model; simpo and orpo have none.
inline bool needs_reference(PreferenceKind k) { return k == PreferenceKind::kDpo || k == PreferenceKind::kIpo; }

struct PreferenceParams {
  PreferenceKind kind = PreferenceKind::kDpo;
  double beta = 0.1;
  double simpo_gamma = 0.5;      // TRL CPOConfig's default
  double label_smoothing = 0.0;  // dpo and simpo: conservative DPO's ls in [0, 0.5)
};

// One micro-batch of pairs: the policy's per-sequence sums (scalar Variables, from
// CausalLM::sequence_logps), each completion's token count, and (dpo/ipo) the reference's sums.
struct PairScores {
  std::vector<ag::Variable> chosen, rejected;
  std::vector<int64_t> chosen_tokens, rejected_tokens;
  std::vector<double> ref_chosen, ref_rejected;
  // orpo: what the chosen sums' total is divided by for the NLL (0: the pairs' chosen tokens, TRL's
  // mean over the batch). A trainer that weighs micro-batches by their share of a step's pairs
  // gives the step's chosen tokens times that share, so that the NLL is a mean over all the step's
  // chosen tokens however its pairs are split over micro-batches and ranks.
  double nll_denominator = 0;
};

// TRL's logged values for the micro-batch (means over its pairs): rewards are beta (pi - ref) for
// dpo/ipo and beta avg for simpo/orpo; logps are pi for dpo/ipo and avg for simpo/orpo, as TRL
// logs them; nll_loss and log_odds_ratio (mean log sigmoid(lo)) only for orpo.
struct PreferenceMetrics {
  double loss = 0, rewards_chosen = 0, rewards_rejected = 0, accuracy = 0, margin = 0;
  double logps_chosen = 0, logps_rejected = 0, nll_loss = 0, log_odds_ratio = 0;
  int64_t pairs = 0;
};

struct PreferenceResult {
  ag::Variable loss;  // f32 scalar on the scores' device
  PreferenceMetrics metrics;
};

// InvalidArgument for mismatched lists, a pair whose completion has no tokens, or beta <= 0.
absl::StatusOr<PreferenceResult> preference_loss(const PairScores& scores, const PreferenceParams& params);

}  // namespace loom
