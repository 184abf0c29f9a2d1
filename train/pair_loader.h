// Preference pairs into micro-batches: `pairs_per_batch` pairs a batch, in a per-epoch shuffled
// order (seed + epoch, the packer's shuffle), each pair's two sequences (prompt + chosen, prompt +
// rejected) in the same batch, never split; labels -100 on the prompt and the padding, unshifted as
// transformers takes them. Two layouts, rows of the batch's longest sequence either way:
//   kPad:  one sequence a row, right-padded (rows [0, P) chosen, [P, 2P) rejected);
//   kPack: the sequences packed into rows first-fit decreasing, positions restarting and a segment
//          per sequence so attention stays within it: fewer rows when lengths differ (what padding
//          would waste, padding_share(), is saved), the same sums.
// Batch::seq_start / seq_len say where each sequence lies. With `groups` > 1 (ranks), the rows come
// in `groups` equal blocks, block r holding pairs [r P / groups, (r + 1) P / groups) of the batch:
// DistContext::slice hands rank r its block.
#pragma once
#include <span>
#include <vector>

#include "train/data.h"
#include "train/preference_data.h"

namespace loom {

// Each pair as two documents, prompt + chosen and prompt + rejected, targets on the completions.
std::vector<Example> pair_documents(const std::vector<PreferenceExample>& pairs);

enum class PairLayout { kPad, kPack };

// The batch of pairs[which[0]], pairs[which[1]], ... in `layout`, `groups` blocks of rows;
// pair_ids = which.
Batch make_pair_batch(const std::vector<PreferenceExample>& pairs, std::span<const int64_t> which, int32_t pad_id,
                      PairLayout layout = PairLayout::kPad, int64_t groups = 1);

// Every pair once, in file order, `pairs_per_batch` a batch (the last one short): the held-out pass
// of --eval-data and the reference pass of --precompute-ref.
std::vector<Batch> pair_batches_in_order(const std::vector<PreferenceExample>& pairs, int64_t pairs_per_batch,
                                         int32_t pad_id, PairLayout layout = PairLayout::kPad, int64_t groups = 1);

class PairLoader final : public BatchLoader {
 public:
  PairLoader(std::vector<PreferenceExample> pairs, int64_t pairs_per_batch, uint64_t seed, int32_t pad_id,
             PairLayout layout = PairLayout::kPad, int64_t groups = 1);
  Batch next() override;
  LoaderState state() const override { return state_; }
  void set_state(const LoaderState& s) override;
  int64_t steps_per_epoch() const override;
  // The longest sequence (prompt + completion) of any pair: what a batch may be padded to.
  int64_t longest() const { return longest_; }
  // Of the tokens an epoch's batches hold (the first epoch's order), the share that is padding:
  // the most that packing pairs into rows could save.
  double padding_share() const;

 private:
  std::vector<PreferenceExample> pairs_;
  int64_t per_batch_;
  uint64_t seed_;
  int32_t pad_id_;
  PairLayout layout_;
  int64_t groups_;
  int64_t longest_ = 0;
  std::vector<int64_t> order_;
  LoaderState state_;
  void reshuffle();
};

}  // namespace loom
