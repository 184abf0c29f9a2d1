// Preference pairs into micro-batches: `pairs_per_batch` pairs a batch, in a per-epoch shuffled
// order (seed + epoch, the packer's shuffle), each pair's two sequences (prompt + chosen, prompt +
// rejected) in the same batch, never split: rows [0, P) chosen, [P, 2P) rejected, right-padded with
// pad_id to the batch's longest sequence (labels -100 on the prompt and the padding, unshifted as
// transformers takes them). Pairs are padded rather than packed: two sequences per pair share one
// prompt, so packing saves little and would need per-document attention in every row.
#pragma once
#include <span>
#include <vector>

#include "train/data.h"
#include "train/preference_data.h"

namespace loom {

// Each pair as two documents, prompt + chosen and prompt + rejected, targets on the completions.
std::vector<Example> pair_documents(const std::vector<PreferenceExample>& pairs);

// The batch of pairs[which[0]], pairs[which[1]], ...: rows [0, P) the chosen sequences, [P, 2P) the
// rejected ones, right-padded with pad_id to their longest; pair_ids = which.
Batch make_pair_batch(const std::vector<PreferenceExample>& pairs, std::span<const int64_t> which, int32_t pad_id);

// Every pair once, in file order, `pairs_per_batch` a batch (the last one short): the held-out pass
// of --eval-data and the reference pass of --precompute-ref.
std::vector<Batch> pair_batches_in_order(const std::vector<PreferenceExample>& pairs, int64_t pairs_per_batch,
                                         int32_t pad_id);

class PairLoader final : public BatchLoader {
 public:
  PairLoader(std::vector<PreferenceExample> pairs, int64_t pairs_per_batch, uint64_t seed, int32_t pad_id);
  Batch next() override;
  LoaderState state() const override { return state_; }
  void set_state(const LoaderState& s) override;
  int64_t steps_per_epoch() const override;
  // The longest sequence (prompt + completion) of any pair: what a batch may be padded to.
  int64_t longest() const { return longest_; }

 private:
  std::vector<PreferenceExample> pairs_;
  int64_t per_batch_;
  uint64_t seed_;
  int32_t pad_id_;
  int64_t longest_ = 0;
  std::vector<int64_t> order_;
  LoaderState state_;
  void reshuffle();
};

}  // namespace loom
