// See preference_forward.h.
#include "train/preference_forward.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "engine/tensor_io.h"
#include "models/lora.h"

namespace loom {
namespace {

absl::StatusOr<Tensor> read_ids(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (!t) return absl::NotFoundError(absl::StrCat(f.path(), ": no tensor named ", name));
  if (t->dtype != DType::i32 || t->shape.size() != 2)
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", name, " must be int32 [pairs, seq], got ",
                                                   std::string(loom::name(t->dtype)), shape_str(t->shape)));
  return read_tensor(f, *t);
}

// The unpadded tokens of each row: the runs of ones of an attention mask i32 [rows, seq], or (no
// mask) the row up to its last target (targets shifted: position j + 1 is labelled when target j is).
absl::StatusOr<std::vector<std::vector<TokenSpan>>> unpadded(const Tensor* mask, const std::vector<int32_t>& targets,
                                                             int64_t rows, int64_t seq, const std::string& what) {
  std::vector<std::vector<TokenSpan>> out(rows);
  const std::vector<int32_t> m = mask ? mask->to_ints() : std::vector<int32_t>();
  for (int64_t r = 0; r < rows; ++r) {
    if (!mask) {
      int64_t last = -1;
      for (int64_t j = 0; j < seq; ++j)
        if (targets[r * seq + j] != ops::kIgnoreIndex) last = j;
      out[r].push_back({0, std::min(seq, last + 2)});
      continue;
    }
    for (int64_t j = 0; j < seq; ++j) {
      const int32_t v = m[r * seq + j];
      if (v != 0 && v != 1)
        return absl::InvalidArgumentError(absl::StrCat(what, " row ", r, " position ", j, " is ", v, " (0 or 1 expected)"));
      if (v == 0) continue;
      if (j > 0 && m[r * seq + j - 1] == 1) ++out[r].back().length;
      else out[r].push_back({j, 1});
    }
    if (out[r].empty()) return absl::InvalidArgumentError(absl::StrCat(what, " row ", r, " masks every token"));
  }
  return out;
}

std::vector<float> values(const std::vector<ag::Variable>& v) {
  std::vector<float> f;
  for (const ag::Variable& x : v) f.push_back(x.value().item());
  return f;
}

}  // namespace

absl::StatusOr<PreferencePairs> read_preference_pairs(const SafetensorsFile& f, const ModelConfig& c) {
  PreferencePairs p;
  for (int k = 0; k < 2; ++k) {
    const std::string side = k == 0 ? "chosen" : "rejected";
    LOOM_ASSIGN_OR_RETURN(Tensor ids, read_ids(f, side + "_input_ids"));
    LOOM_ASSIGN_OR_RETURN(Tensor labels, read_ids(f, side + "_labels"));
    if (labels.shape() != ids.shape())
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", side, "_labels ", shape_str(labels.shape()), " and ",
                                                     side, "_input_ids ", shape_str(ids.shape()), " differ in shape"));
    const int64_t rows = ids.size(0), seq = ids.size(1);
    if (seq > c.max_position_embeddings)
      return absl::OutOfRangeError(absl::StrCat(f.path(), ": ", side, " sequences of ", seq, " tokens exceed the model's ",
                                                "max_position_embeddings ", c.max_position_embeddings));
    LOOM_RETURN_IF_ERROR(check_token_ids(ids, c.vocab_size, false, (f.path() + ": " + side + "_input_ids").c_str()));
    Tensor targets = shift_labels(labels);
    LOOM_RETURN_IF_ERROR(check_token_ids(targets, c.vocab_size, true, (f.path() + ": " + side + "_labels").c_str()));
    const std::vector<int32_t> t = targets.to_ints();
    std::vector<int64_t>& tokens = k == 0 ? p.chosen_tokens : p.rejected_tokens;
    for (int64_t r = 0; r < rows; ++r) {
      int64_t n = 0;
      for (int64_t j = 0; j < seq; ++j) n += t[r * seq + j] != ops::kIgnoreIndex;
      if (n == 0)
        return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", side, "_labels row ", r,
                                                       " has no completion token after the first position (all -100)"));
      tokens.push_back(n);
    }
    std::optional<Tensor> mask;
    if (f.find(side + "_attention_mask")) {
      LOOM_ASSIGN_OR_RETURN(mask, read_ids(f, side + "_attention_mask"));
      if (mask->shape() != ids.shape())
        return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", side, "_attention_mask ", shape_str(mask->shape()),
                                                       " and ", side, "_input_ids ", shape_str(ids.shape()),
                                                       " differ in shape"));
    }
    LOOM_ASSIGN_OR_RETURN((k == 0 ? p.chosen_unpadded : p.rejected_unpadded),
                          unpadded(mask ? &*mask : nullptr, t, rows, seq, f.path() + ": " + side + "_attention_mask"));
    (k == 0 ? p.chosen_ids : p.rejected_ids) = ids;
    (k == 0 ? p.chosen_targets : p.rejected_targets) = targets;
  }
  if (p.chosen_ids.size(0) != p.rejected_ids.size(0))
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", p.chosen_ids.size(0), " chosen and ",
                                                   p.rejected_ids.size(0), " rejected sequences; a pair needs one of each"));
  return p;
}

absl::StatusOr<PreferenceForward> preference_forward(CausalLM& model, const PreferencePairs& pairs,
                                                     const PreferenceParams& params, double router_aux_loss_coef) {
  // Rows [0, P) the chosen sides, [P, 2P) the rejected ones, the shorter side padded with token 0 and
  // -100 (after every real token: causal attention never sees it).
  const int64_t P = pairs.chosen_ids.size(0), sc = pairs.chosen_ids.size(1), sr = pairs.rejected_ids.size(1);
  const int64_t S = std::max(sc, sr);
  std::vector<int32_t> ids(2 * P * S, 0), targets(2 * P * S, ops::kIgnoreIndex);
  std::vector<CausalLM::Span> seqs;
  std::vector<TokenSpan> unpadded_tokens;
  for (int side = 0; side < 2; ++side) {
    const std::vector<int32_t> id = (side == 0 ? pairs.chosen_ids : pairs.rejected_ids).to_ints();
    const std::vector<int32_t> t = (side == 0 ? pairs.chosen_targets : pairs.rejected_targets).to_ints();
    const int64_t s = side == 0 ? sc : sr;
    for (int64_t r = 0; r < P; ++r) {
      const int64_t row = (side * P + r) * S;
      std::copy(id.begin() + r * s, id.begin() + (r + 1) * s, ids.begin() + row);
      std::copy(t.begin() + r * s, t.begin() + (r + 1) * s, targets.begin() + row);
      seqs.push_back({row, s});
      for (const TokenSpan& u : (side == 0 ? pairs.chosen_unpadded : pairs.rejected_unpadded)[r])
        unpadded_tokens.push_back({row + u.start, u.length});
    }
  }
  const Tensor input_ids = Tensor::from_ints(ids, {2 * P, S}), all_targets = Tensor::from_ints(targets, {2 * P * S});

  PreferenceForward out;
  PairScores scores;
  ForwardOptions opt;
  if (model.config().moe.experts > 0) opt.aux_loss = &out.aux_loss, opt.aux_spans = unpadded_tokens;
  const std::vector<ag::Variable> all = model.sequence_logps(input_ids, all_targets, opt, seqs);
  scores.chosen.assign(all.begin(), all.begin() + P);
  scores.rejected.assign(all.begin() + P, all.end());
  scores.chosen_tokens = pairs.chosen_tokens;
  scores.rejected_tokens = pairs.rejected_tokens;
  if (needs_reference(params.kind)) {
    ag::NoGradGuard ng;
    AdaptersOff off(model);  // nothing to switch off for a model without adapters: it is its own reference
    const std::vector<float> ref = values(model.sequence_logps(input_ids, all_targets, {}, seqs));
    out.ref_chosen.assign(ref.begin(), ref.begin() + P);
    out.ref_rejected.assign(ref.begin() + P, ref.end());
    scores.ref_chosen.assign(out.ref_chosen.begin(), out.ref_chosen.end());
    scores.ref_rejected.assign(out.ref_rejected.begin(), out.ref_rejected.end());
  }
  out.chosen = values(scores.chosen);
  out.rejected = values(scores.rejected);
  LOOM_ASSIGN_OR_RETURN(out.result, preference_loss(scores, params));
  out.result.loss = add_load_balancing(out.result.loss, out.aux_loss, router_aux_loss_coef);
  return out;
}

}  // namespace loom
