// See pair_loader.h.
#include "train/pair_loader.h"

#include <algorithm>

#include "kernels/common.h"

namespace loom {

PairLoader::PairLoader(std::vector<PreferenceExample> pairs, int64_t pairs_per_batch, uint64_t seed, int32_t pad_id)
    : pairs_(std::move(pairs)), per_batch_(pairs_per_batch), seed_(seed), pad_id_(pad_id) {
  LOOM_CHECK(!pairs_.empty() && per_batch_ > 0, "PairLoader: ", pairs_.size(), " pairs, ", per_batch_, " a batch");
  for (const PreferenceExample& p : pairs_)
    longest_ = std::max<int64_t>(longest_, static_cast<int64_t>(p.prompt.size() + std::max(p.chosen.size(), p.rejected.size())));
  reshuffle();
}

void PairLoader::reshuffle() { order_ = shuffled_order(static_cast<int64_t>(pairs_.size()), seed_, state_.epoch); }

int64_t PairLoader::steps_per_epoch() const {
  return (static_cast<int64_t>(pairs_.size()) + per_batch_ - 1) / per_batch_;
}

void PairLoader::set_state(const LoaderState& s) {
  LOOM_CHECK(s.epoch >= 0 && s.cursor >= 0 && s.cursor < static_cast<int64_t>(pairs_.size()) && s.offset == 0,
             "PairLoader::set_state: epoch ", s.epoch, " cursor ", s.cursor, " offset ", s.offset, " does not fit ",
             pairs_.size(), " pairs (was the data changed?)");
  state_ = s;
  reshuffle();
}

Batch PairLoader::next() {
  const int64_t n = static_cast<int64_t>(pairs_.size());
  // The epoch's last batch may be short: its pairs only (a batch never spans two epochs).
  const int64_t P = std::min(per_batch_, n - state_.cursor);
  Batch b = make_pair_batch(pairs_, std::span<const int64_t>(order_).subspan(state_.cursor, P), pad_id_);
  state_.cursor += P;
  if (state_.cursor >= n) {
    ++state_.epoch;
    state_.cursor = 0;
    reshuffle();
  }
  return b;
}

std::vector<Example> pair_documents(const std::vector<PreferenceExample>& pairs) {
  std::vector<Example> docs;
  docs.reserve(2 * pairs.size());
  for (const PreferenceExample& p : pairs)
    for (const std::vector<int32_t>* side : {&p.chosen, &p.rejected}) {
      Example e;
      e.ids = p.prompt, e.target.assign(p.prompt.size(), 0);
      e.ids.insert(e.ids.end(), side->begin(), side->end());
      e.target.resize(e.ids.size(), 1);
      docs.push_back(std::move(e));
    }
  return docs;
}

Batch make_pair_batch(const std::vector<PreferenceExample>& pairs, std::span<const int64_t> which, int32_t pad_id) {
  const int64_t P = static_cast<int64_t>(which.size());
  LOOM_CHECK(P > 0, "make_pair_batch: no pair");
  int64_t S = 1;
  for (int64_t k : which) {
    const PreferenceExample& p = pairs[k];
    S = std::max<int64_t>(S, static_cast<int64_t>(p.prompt.size() + std::max(p.chosen.size(), p.rejected.size())));
  }
  std::vector<int32_t> ids(2 * P * S, pad_id), labels(2 * P * S, -100), positions(2 * P * S), segments(2 * P * S, 0);
  Batch b;
  b.pairs = P;
  b.pair_ids.assign(which.begin(), which.end());
  for (int64_t i = 0; i < P; ++i) {
    const PreferenceExample& p = pairs[which[i]];
    for (int side = 0; side < 2; ++side) {
      const std::vector<int32_t>& completion = side == 0 ? p.chosen : p.rejected;
      const int64_t row = side * P + i;
      int64_t at = row * S;
      for (int32_t t : p.prompt) ids[at++] = t;
      for (int32_t t : completion) labels[at] = t, ids[at++] = t;
      b.tokens += static_cast<int64_t>(p.prompt.size() + completion.size());
      b.target_tokens += static_cast<int64_t>(completion.size());
      for (int64_t k = 0; k < S; ++k) positions[row * S + k] = static_cast<int32_t>(k);
    }
  }
  b.input_ids = Tensor::from_ints(ids, {2 * P, S});
  b.labels = Tensor::from_ints(labels, {2 * P, S});
  b.positions = Tensor::from_ints(positions, {2 * P * S});
  b.segment_ids = Tensor::from_ints(segments, {2 * P, S});
  return b;
}

std::vector<Batch> pair_batches_in_order(const std::vector<PreferenceExample>& pairs, int64_t pairs_per_batch,
                                         int32_t pad_id) {
  LOOM_CHECK(pairs_per_batch > 0, "pair_batches_in_order: ", pairs_per_batch, " pairs a batch");
  std::vector<int64_t> all(pairs.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  std::vector<Batch> out;
  for (size_t at = 0; at < all.size(); at += static_cast<size_t>(pairs_per_batch))
    out.push_back(make_pair_batch(
        pairs, std::span<const int64_t>(all).subspan(at, std::min<size_t>(pairs_per_batch, all.size() - at)), pad_id));
  return out;
}

}  // namespace loom
