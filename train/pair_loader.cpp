// See pair_loader.h.
#include "train/pair_loader.h"

#include <algorithm>

#include "kernels/common.h"

namespace loom {

PairLoader::PairLoader(std::vector<PreferenceExample> pairs, int64_t pairs_per_batch, uint64_t seed, int32_t pad_id,
                       PairLayout layout, int64_t groups)
    : pairs_(std::move(pairs)), per_batch_(pairs_per_batch), seed_(seed), pad_id_(pad_id), layout_(layout), groups_(groups) {
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

double PairLoader::padding_share() const {
  const std::vector<int64_t> order = shuffled_order(static_cast<int64_t>(pairs_.size()), seed_, 0);
  double held = 0, real = 0;
  for (size_t at = 0; at < order.size(); at += static_cast<size_t>(per_batch_)) {
    const size_t end = std::min(order.size(), at + static_cast<size_t>(per_batch_));
    size_t longest = 1;
    for (size_t i = at; i < end; ++i) {
      const PreferenceExample& p = pairs_[order[i]];
      longest = std::max(longest, p.prompt.size() + std::max(p.chosen.size(), p.rejected.size()));
      real += static_cast<double>(2 * p.prompt.size() + p.chosen.size() + p.rejected.size());
    }
    held += 2.0 * static_cast<double>(end - at) * static_cast<double>(longest);
  }
  return held > 0 ? 1.0 - real / held : 0.0;
}

Batch PairLoader::next() {
  const int64_t n = static_cast<int64_t>(pairs_.size());
  // The epoch's last batch may be short: its pairs only (a batch never spans two epochs).
  const int64_t P = std::min(per_batch_, n - state_.cursor);
  Batch b = make_pair_batch(pairs_, std::span<const int64_t>(order_).subspan(state_.cursor, P), pad_id_, layout_, groups_);
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

Batch make_pair_batch(const std::vector<PreferenceExample>& pairs, std::span<const int64_t> which, int32_t pad_id,
                      PairLayout layout, int64_t groups) {
  const int64_t P = static_cast<int64_t>(which.size());
  LOOM_CHECK(P > 0 && groups > 0, "make_pair_batch: ", P, " pairs in ", groups, " groups");
  auto length = [&](int64_t k, int side) {
    const PreferenceExample& p = pairs[which[k]];
    return static_cast<int64_t>(p.prompt.size() + (side == 0 ? p.chosen.size() : p.rejected.size()));
  };
  int64_t W = 1;  // the row width: the batch's longest sequence
  for (int64_t k = 0; k < P; ++k) W = std::max({W, length(k, 0), length(k, 1)});
  // Where each sequence goes, per group: (row within the group, column). Sequence j < P is pair j's
  // chosen side, P + j its rejected side.
  std::vector<int64_t> row_of(2 * P), col_of(2 * P);
  int64_t R = 1;  // rows a group
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t lo = g * P / groups, hi = (g + 1) * P / groups;
    std::vector<int64_t> seqs;
    for (int side = 0; side < 2; ++side)
      for (int64_t k = lo; k < hi; ++k) seqs.push_back(side * P + k);
    int64_t rows = 0;
    if (layout == PairLayout::kPad) {
      for (int64_t j : seqs) row_of[j] = rows++, col_of[j] = 0;
    } else {  // first fit decreasing: the longest sequence first, each into the first row it fits
      std::stable_sort(seqs.begin(), seqs.end(),
                       [&](int64_t a, int64_t b) { return length(a % P, static_cast<int>(a / P)) > length(b % P, static_cast<int>(b / P)); });
      std::vector<int64_t> used;
      for (int64_t j : seqs) {
        const int64_t len = length(j % P, static_cast<int>(j / P));
        size_t r = 0;
        while (r < used.size() && used[r] + len > W) ++r;
        if (r == used.size()) used.push_back(0);
        row_of[j] = static_cast<int64_t>(r), col_of[j] = used[r];
        used[r] += len;
      }
      rows = static_cast<int64_t>(used.size());
    }
    R = std::max(R, rows);
  }
  const int64_t rows = groups * R;
  std::vector<int32_t> ids(rows * W, pad_id), labels(rows * W, -100), positions(rows * W, 0), segments(rows * W, -1);
  std::vector<uint8_t> starts(rows * W, 0);
  Batch b;
  b.pairs = P;
  b.groups = groups;
  b.pair_ids.assign(which.begin(), which.end());
  b.seq_start.resize(2 * P), b.seq_len.resize(2 * P);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t lo = g * P / groups, hi = (g + 1) * P / groups;
    for (int side = 0; side < 2; ++side)
      for (int64_t k = lo; k < hi; ++k) {
        const int64_t j = side * P + k, row = g * R + row_of[j], len = length(k, side);
        const PreferenceExample& p = pairs[which[k]];
        const std::vector<int32_t>& completion = side == 0 ? p.chosen : p.rejected;
        const int64_t at0 = row * W + col_of[j];
        int64_t at = at0;
        for (int32_t t : p.prompt) ids[at++] = t;
        for (int32_t t : completion) labels[at] = t, ids[at++] = t;
        labels[at0] = -100;  // a sequence's first token is never predicted (nothing before it in its segment)
        starts[at0] = 1;
        for (int64_t c = 0; c < len; ++c) positions[at0 + c] = static_cast<int32_t>(c), segments[at0 + c] = 0;
        // The padded layout keeps its whole row as the sequence's span (its padding has no targets).
        b.seq_start[j] = layout == PairLayout::kPad ? row * W : at0;
        b.seq_len[j] = layout == PairLayout::kPad ? W : len;
        b.tokens += len;
        b.target_tokens += static_cast<int64_t>(completion.size()) - (p.prompt.empty() ? 1 : 0);
      }
  }
  // Segment ids in column order (a row's sequences fill a prefix of it), then the padding: its own
  // segment, positions restarting (no target either way).
  for (int64_t r = 0; r < rows; ++r) {
    int32_t segment = -1;
    int64_t c = r * W;
    for (; c < (r + 1) * W && segments[c] >= 0; ++c) segment += starts[c], segments[c] = segment;
    for (int32_t pos = 0; c < (r + 1) * W; ++c) segments[c] = segment + 1, positions[c] = pos++;
  }
  // The padded layout has one sequence a row, right-padded, as transformers sees it: segment ids all
  // 0 (no segment mask) and positions 0..W-1 along the whole row.
  if (layout == PairLayout::kPad) {
    std::fill(segments.begin(), segments.end(), 0);
    for (int64_t i = 0; i < rows * W; ++i) positions[i] = static_cast<int32_t>(i % W);
  }
  b.input_ids = Tensor::from_ints(ids, {rows, W});
  b.labels = Tensor::from_ints(labels, {rows, W});
  b.positions = Tensor::from_ints(positions, {rows * W});
  b.segment_ids = Tensor::from_ints(segments, {rows, W});
  return b;
}

std::vector<Batch> pair_batches_in_order(const std::vector<PreferenceExample>& pairs, int64_t pairs_per_batch,
                                         int32_t pad_id, PairLayout layout, int64_t groups) {
  LOOM_CHECK(pairs_per_batch > 0, "pair_batches_in_order: ", pairs_per_batch, " pairs a batch");
  std::vector<int64_t> all(pairs.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  std::vector<Batch> out;
  for (size_t at = 0; at < all.size(); at += static_cast<size_t>(pairs_per_batch))
    out.push_back(make_pair_batch(
        pairs, std::span<const int64_t>(all).subspan(at, std::min<size_t>(pairs_per_batch, all.size() - at)), pad_id,
        layout, groups));
  return out;
}

}  // namespace loom
