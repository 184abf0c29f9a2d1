// See preference_forward.h.
#include "train/preference_forward.h"

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
    (k == 0 ? p.chosen_ids : p.rejected_ids) = ids;
    (k == 0 ? p.chosen_targets : p.rejected_targets) = targets;
  }
  if (p.chosen_ids.size(0) != p.rejected_ids.size(0))
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", p.chosen_ids.size(0), " chosen and ",
                                                   p.rejected_ids.size(0), " rejected sequences; a pair needs one of each"));
  return p;
}

absl::StatusOr<PreferenceForward> preference_forward(CausalLM& model, const PreferencePairs& pairs,
                                                     const PreferenceParams& params) {
  PreferenceForward out;
  PairScores scores;
  scores.chosen = model.sequence_logps(pairs.chosen_ids, pairs.chosen_targets);
  scores.rejected = model.sequence_logps(pairs.rejected_ids, pairs.rejected_targets);
  scores.chosen_tokens = pairs.chosen_tokens;
  scores.rejected_tokens = pairs.rejected_tokens;
  if (needs_reference(params.kind)) {
    ag::NoGradGuard ng;
    AdaptersOff off(model);  // nothing to switch off for a model without adapters: it is its own reference
    out.ref_chosen = values(model.sequence_logps(pairs.chosen_ids, pairs.chosen_targets));
    out.ref_rejected = values(model.sequence_logps(pairs.rejected_ids, pairs.rejected_targets));
    scores.ref_chosen.assign(out.ref_chosen.begin(), out.ref_chosen.end());
    scores.ref_rejected.assign(out.ref_rejected.begin(), out.ref_rejected.end());
  }
  out.chosen = values(scores.chosen);
  out.rejected = values(scores.rejected);
  LOOM_ASSIGN_OR_RETURN(out.result, preference_loss(scores, params));
  return out;
}

}  // namespace loom
