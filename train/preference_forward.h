// One forward of a preference objective over a file of pairs (`loom forward --objective`, and the
// trainer's preference micro-batch): the policy's summed completion log-probabilities of both sides,
// the reference's (dpo/ipo: the same model with its LoRA adapters off, no second copy; a model
// without adapters is its own reference), and the loss of train/preference_loss.h.
#pragma once
#include <vector>

#include "absl/status/statusor.h"
#include "engine/safetensors.h"
#include "models/causal_lm.h"
#include "train/preference_loss.h"

namespace loom {

// Both sides of the pairs, [pairs, seq] each (the two may differ in seq): token ids and the
// shifted targets (labels unshifted in the file, as transformers takes them: -100 on the prompt and
// the padding), each completion's target count, and each sequence's tokens that are not padding
// (spans of its row's flat positions: the runs of ones of <side>_attention_mask when the file has
// it, else the row up to its last labelled token, as TRL lays pairs out: prompt, completion, padding).
struct PreferencePairs {
  Tensor chosen_ids, rejected_ids;          // i32 [pairs, seq]
  Tensor chosen_targets, rejected_targets;  // i32 [pairs*seq], on the host
  std::vector<int64_t> chosen_tokens, rejected_tokens;
  std::vector<std::vector<TokenSpan>> chosen_unpadded, rejected_unpadded;  // per pair, within its row
};

// Reads chosen_input_ids, chosen_labels, rejected_input_ids, rejected_labels (int32 [pairs, seq]),
// and chosen_attention_mask / rejected_attention_mask (int32 [pairs, seq] of 0 and 1) when there,
// and checks them against the model (ids in the vocabulary, lengths within max_position_embeddings,
// a completion token in every sequence), with errors naming the tensor and the position.
absl::StatusOr<PreferencePairs> read_preference_pairs(const SafetensorsFile& file, const ModelConfig& config);

struct PreferenceForward {
  // The loss (backpropagate it for the gradients; with a mixture-of-experts model, plus
  // router_aux_loss_coef times aux_loss) and TRL's metrics.
  PreferenceResult result;
  std::vector<float> chosen, rejected;          // the policy's pi per pair
  std::vector<float> ref_chosen, ref_rejected;  // dpo/ipo: the reference's
  // Mixture-of-experts models: the load-balancing loss of the policy's forward over both sides'
  // unpadded tokens (TRL's DPOTrainer: outputs.aux_loss of its chosen + rejected batch); undefined
  // for a dense model.
  ag::Variable aux_loss;
};

// Both sides in one policy forward (as TRL concatenates them; the shorter side's rows padded), the
// reference's in one more.
absl::StatusOr<PreferenceForward> preference_forward(CausalLM& model, const PreferencePairs& pairs,
                                                     const PreferenceParams& params, double router_aux_loss_coef = 0);

}  // namespace loom
