// See preference_loss.h. Every formula is written once, as a function of the per-sequence sums
// that returns the mean loss and fills its derivatives (the autograd node's backward).
#include "train/preference_loss.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "autograd/functions.h"

namespace loom {
namespace {

double softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }
double sigmoid(double x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); }
// log(1 - e^a) for a < 0, stable at both ends (TRL's log1mexp).
double log1mexp(double a) { return a > -std::log(2.0) ? std::log(-std::expm1(a)) : std::log1p(-std::exp(a)); }

}  // namespace

absl::StatusOr<PreferenceKind> parse_preference_kind(const std::string& name) {
  if (name == "dpo") return PreferenceKind::kDpo;
  if (name == "ipo") return PreferenceKind::kIpo;
  if (name == "simpo") return PreferenceKind::kSimpo;
  if (name == "orpo") return PreferenceKind::kOrpo;
  return absl::InvalidArgumentError(absl::StrCat("unknown preference objective '", name, "' (there is: dpo, ipo, simpo, orpo)"));
}

const char* preference_name(PreferenceKind k) {
  switch (k) {
    case PreferenceKind::kDpo: return "dpo";
    case PreferenceKind::kIpo: return "ipo";
    case PreferenceKind::kSimpo: return "simpo";
    case PreferenceKind::kOrpo: return "orpo";
  }
  return "?";
}

absl::StatusOr<PreferenceResult> preference_loss(const PairScores& s, const PreferenceParams& p) {
  const size_t n = s.chosen.size();
  if (n == 0 || s.rejected.size() != n || s.chosen_tokens.size() != n || s.rejected_tokens.size() != n)
    return absl::InvalidArgumentError(absl::StrCat("preference_loss: ", n, " chosen, ", s.rejected.size(), " rejected, ",
                                                   s.chosen_tokens.size(), "/", s.rejected_tokens.size(), " token counts"));
  const bool ref = needs_reference(p.kind);
  if (ref && (s.ref_chosen.size() != n || s.ref_rejected.size() != n))
    return absl::InvalidArgumentError(absl::StrCat("preference_loss: ", preference_name(p.kind), " needs the reference's ",
                                                   "log-probabilities of every pair"));
  if (!(p.beta > 0) || !std::isfinite(p.beta)) return absl::InvalidArgumentError(absl::StrCat("--beta must be > 0, got ", p.beta));
  if (!(p.label_smoothing >= 0 && p.label_smoothing < 0.5))
    return absl::InvalidArgumentError(absl::StrCat("--label-smoothing must be in [0, 0.5), got ", p.label_smoothing));
  for (size_t i = 0; i < n; ++i)
    if (s.chosen_tokens[i] <= 0 || s.rejected_tokens[i] <= 0)
      return absl::InvalidArgumentError(absl::StrCat("preference pair ", i, " has a completion without tokens (chosen ",
                                                     s.chosen_tokens[i], ", rejected ", s.rejected_tokens[i], ")"));
  PreferenceMetrics m;
  m.pairs = static_cast<int64_t>(n);
  const double beta = p.beta, ls = p.label_smoothing, inv_n = 1.0 / static_cast<double>(n);
  int64_t chosen_tokens = 0;
  for (int64_t t : s.chosen_tokens) chosen_tokens += t;
  const double chosen_total = s.nll_denominator > 0 ? s.nll_denominator : static_cast<double>(chosen_tokens);
  // x: chosen sums, then rejected sums; d: dloss/dx.
  auto f = [&](const std::vector<double>& x, std::vector<double>& d) {
    double loss = 0;
    m = PreferenceMetrics{};
    m.pairs = static_cast<int64_t>(n);
    for (size_t i = 0; i < n; ++i) {
      const double pc = x[i], pr = x[n + i];
      const double nc = static_cast<double>(s.chosen_tokens[i]), nr = static_cast<double>(s.rejected_tokens[i]);
      double rc = 0, rr = 0;  // rewards
      switch (p.kind) {
        case PreferenceKind::kDpo: {
          const double z = beta * ((pc - s.ref_chosen[i]) - (pr - s.ref_rejected[i]));
          loss += (1 - ls) * softplus(-z) + ls * softplus(z);
          const double dz = (1 - ls) * -sigmoid(-z) + ls * sigmoid(z);
          d[i] = dz * beta * inv_n, d[n + i] = -dz * beta * inv_n;
          rc = beta * (pc - s.ref_chosen[i]), rr = beta * (pr - s.ref_rejected[i]);
          m.logps_chosen += pc, m.logps_rejected += pr;
          break;
        }
        case PreferenceKind::kIpo: {
          const double h = (pc - s.ref_chosen[i]) / nc - (pr - s.ref_rejected[i]) / nr;
          const double e = h - 1 / (2 * beta);
          loss += e * e;
          d[i] = 2 * e / nc * inv_n, d[n + i] = -2 * e / nr * inv_n;
          rc = beta * (pc - s.ref_chosen[i]), rr = beta * (pr - s.ref_rejected[i]);
          m.logps_chosen += pc, m.logps_rejected += pr;
          break;
        }
        case PreferenceKind::kSimpo: {
          const double ac = pc / nc, ar = pr / nr;
          const double z = beta * (ac - ar) - p.simpo_gamma;
          loss += (1 - ls) * softplus(-z) + ls * softplus(z);
          const double dz = (1 - ls) * -sigmoid(-z) + ls * sigmoid(z);
          d[i] = dz * beta / nc * inv_n, d[n + i] = -dz * beta / nr * inv_n;
          rc = beta * ac, rr = beta * ar;
          m.logps_chosen += ac, m.logps_rejected += ar;
          break;
        }
        case PreferenceKind::kOrpo: {
          const double ac = pc / nc, ar = pr / nr;
          const double lo = (ac - ar) - (log1mexp(ac) - log1mexp(ar));
          const double log_sig = -softplus(-lo);
          // loss = nll - beta * mean(log sigmoid(lo)); nll = -sum(pc) / sum(nc) over the pairs.
          loss += -beta * log_sig;
          const double dlo = -beta * sigmoid(-lo);
          // d lo / d ac = 1 + e^ac / (1 - e^ac) = -1 / expm1(ac); likewise for ar with the sign flipped.
          d[i] = (dlo * (-1 / std::expm1(ac)) / nc) * inv_n - 1.0 / chosen_total;
          d[n + i] = (dlo * (1 / std::expm1(ar)) / nr) * inv_n;
          m.nll_loss += -pc;
          m.log_odds_ratio += log_sig;
          rc = beta * ac, rr = beta * ar;
          m.logps_chosen += ac, m.logps_rejected += ar;
          break;
        }
      }
      m.rewards_chosen += rc, m.rewards_rejected += rr, m.margin += rc - rr, m.accuracy += rc > rr ? 1 : 0;
    }
    loss *= inv_n;
    if (p.kind == PreferenceKind::kOrpo) {
      m.nll_loss /= chosen_total;
      loss += m.nll_loss;
    }
    for (double* v : {&m.rewards_chosen, &m.rewards_rejected, &m.margin, &m.accuracy, &m.logps_chosen, &m.logps_rejected,
                      &m.log_odds_ratio})
      *v *= inv_n;
    m.loss = loss;
    return loss;
  };
  std::vector<ag::Variable> inputs(s.chosen);
  inputs.insert(inputs.end(), s.rejected.begin(), s.rejected.end());
  PreferenceResult r;
  r.loss = ag::host_scalar(inputs, f);
  r.metrics = m;
  return r;
}

}  // namespace loom
