// PackedLoader: greedy packing of tokenized documents into fixed-length rows (positions restarting
// and segment ids increasing per document, so attention never crosses documents), a per-epoch
// shuffle that is identical on every platform, rank sharding and an exactly resumable position.
#include <algorithm>

#include "engine/splitmix64.h"
#include "kernels/error.h"
#include "train/data.h"

namespace loom {
namespace {

constexpr int32_t kIgnore = -100;
// A batch's width is its longest row rounded up to this (at most seq_len): few distinct shapes (each
// new GEMM shape costs a heuristic query, or timed trials under --gemm-autotune), whole attention tiles.
constexpr int64_t kWidthStep = 64;

// Uniform in [0, n) without modulo bias (rejects the low 2^64 mod n values).
uint64_t uniform_below(uint64_t* state, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t r = splitmix64(state);
    if (r >= threshold) return r % n;
  }
}


// One piece of a document placed in a row: tokens [begin, end) of the document at order index `at`.
struct Piece {
  int64_t at, begin, end;
};

// Fills one row of seq_len from (cursor, offset) over documents of lengths len(order index),
// advancing the cursor; pieces get the row's documents in order. The packing rule of data.h.
template <class LenFn>
void next_row(int64_t n, LenFn len, int64_t seq_len, int64_t* cursor, int64_t* offset, std::vector<Piece>* pieces) {
  pieces->clear();
  int64_t used = 0;
  while (used < seq_len && *cursor < n) {
    const int64_t length = len(*cursor);
    const int64_t remaining = length - *offset;
    const int64_t space = seq_len - used;
    if (remaining <= space) {  // the rest of the document fits
      pieces->push_back({*cursor, *offset, length});
      used += remaining;
      ++*cursor;
      *offset = 0;
    } else if (*offset == 0 && length <= seq_len && used > 0) {
      break;  // it would fit in a row of its own: start the next row with it
    } else {  // longer than a row: fill this row and continue in the next
      pieces->push_back({*cursor, *offset, *offset + space});
      *offset += space;
      used = seq_len;
    }
  }
}

int64_t rows_in_pass(const std::vector<int64_t>& lengths, const std::vector<int64_t>& order, int64_t seq_len) {
  const int64_t n = static_cast<int64_t>(lengths.size());
  int64_t cursor = 0, offset = 0, rows = 0;
  std::vector<Piece> pieces;
  while (cursor < n) {
    next_row(n, [&](int64_t i) { return lengths[order[i]]; }, seq_len, &cursor, &offset, &pieces);
    ++rows;
  }
  return rows;
}

}  // namespace

std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  uint64_t state = seed ^ (0xD6E8FEB86659FD93ull * (static_cast<uint64_t>(epoch) + 1));
  (void)splitmix64(&state);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(uniform_below(&state, static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

PackedLoader::PackedLoader(std::vector<Example> examples, int64_t seq_len, int64_t batch_size, uint64_t seed,
                           int rank, int world, int32_t pad_id)
    : seq_len_(seq_len), batch_size_(batch_size), seed_(seed), pad_id_(pad_id) {
  LOOM_CHECK(seq_len > 0 && batch_size > 0, "PackedLoader: seq_len and batch_size must be positive, got seq_len=",
             seq_len, " batch_size=", batch_size);
  LOOM_CHECK(world >= 1 && rank >= 0 && rank < world, "PackedLoader: rank ", rank, " is not in a world of ", world);
  // Every rank's shard size in epoch 0 order, so that steps_per_epoch() agrees on all ranks.
  std::vector<std::vector<int64_t>> shard_lengths(world);
  for (size_t i = 0; i < examples.size(); ++i) {
    LOOM_CHECK(examples[i].ids.size() == examples[i].target.size(), "PackedLoader: example ", i, " has ",
               examples[i].ids.size(), " ids but ", examples[i].target.size(), " target flags");
    if (examples[i].ids.empty()) continue;
    const int r = static_cast<int>(i % static_cast<size_t>(world));
    shard_lengths[r].push_back(static_cast<int64_t>(examples[i].ids.size()));
    if (r == rank) examples_.push_back(std::move(examples[i]));
  }
  LOOM_CHECK(!examples_.empty(), "PackedLoader: rank ", rank, " of ", world, " has no non-empty documents (",
             examples.size(), " documents in all)");
  for (int r = 0; r < world; ++r) {
    const auto& lengths = shard_lengths[r];
    const int64_t rows = rows_in_pass(lengths, shuffled_order(static_cast<int64_t>(lengths.size()), seed, 0), seq_len);
    steps_per_epoch_ = std::max(steps_per_epoch_, (rows + batch_size - 1) / batch_size);
  }
  reshuffle();
}

void PackedLoader::reshuffle() { order_ = shuffled_order(static_cast<int64_t>(examples_.size()), seed_, state_.epoch); }

Batch PackedLoader::next() {
  const int64_t n = static_cast<int64_t>(examples_.size());
  const int64_t S = seq_len_, B = batch_size_;
  std::vector<int32_t> ids(B * S, pad_id_), labels(B * S, kIgnore), positions(B * S, 0), segments(B * S, 0);
  Batch batch;
  std::vector<Piece> pieces;
  for (int64_t r = 0; r < B; ++r) {
    next_row(n, [&](int64_t i) { return static_cast<int64_t>(examples_[order_[i]].ids.size()); }, S, &state_.cursor,
             &state_.offset, &pieces);
    int64_t at = r * S;
    int32_t segment = 0;
    for (const Piece& p : pieces) {
      const Example& ex = examples_[order_[p.at]];
      for (int64_t k = p.begin; k < p.end; ++k, ++at) {
        ids[at] = ex.ids[k];
        positions[at] = static_cast<int32_t>(k - p.begin);
        segments[at] = segment;
        // No loss at a piece's first token: nothing before it in the row belongs to its document.
        if (k > p.begin && ex.target[k]) {
          labels[at] = ex.ids[k];
          ++batch.target_tokens;
        }
      }
      batch.tokens += p.end - p.begin;
      ++segment;
    }
    batch.row_tokens.push_back(at - r * S);
    for (int32_t pos = 0; at < (r + 1) * S; ++at, ++pos) {  // padding: its own segment
      positions[at] = pos;
      segments[at] = segment;
    }
  }
  if (state_.cursor >= n) {  // the shard is used up: the next batch starts the next epoch
    ++state_.epoch;
    state_.cursor = 0;
    state_.offset = 0;
    reshuffle();
  }
  // The batch as wide as its longest row needs (a multiple of kWidthStep, at most seq_len), as a
  // collator padding to the longest: an epoch's last batch holds what was left (a small data set's
  // every epoch ended with a step over mostly padding: the demo's 66 tokens in two rows of 256), and
  // rows that each hold one document too long to share them end early.
  const int64_t longest = *std::max_element(batch.row_tokens.begin(), batch.row_tokens.end());
  const int64_t W = std::min(S, std::max<int64_t>(1, (longest + kWidthStep - 1) / kWidthStep) * kWidthStep);
  if (W < S) {
    auto narrow = [&](std::vector<int32_t>& v) {
      for (int64_t r = 0; r < B; ++r) std::copy_n(v.begin() + r * S, W, v.begin() + r * W);
      v.resize(B * W);
    };
    for (std::vector<int32_t>* v : {&ids, &labels, &positions, &segments}) narrow(*v);
  }
  batch.input_ids = Tensor::from_ints(ids, {B, W});
  batch.labels = Tensor::from_ints(labels, {B, W});
  batch.positions = Tensor::from_ints(positions, {B * W});
  batch.segment_ids = Tensor::from_ints(segments, {B, W});
  return batch;
}

bool one_segment_per_row(const Batch& batch) {
  if (!batch.segment_ids.defined()) return true;
  for (int32_t s : batch.segment_ids.to_ints()) {
    if (s != 0) return false;
  }
  return true;
}

LoaderState PackedLoader::state() const { return state_; }

void PackedLoader::set_state(const LoaderState& s) {
  const int64_t n = static_cast<int64_t>(examples_.size());
  LOOM_CHECK(s.epoch >= 0 && s.cursor >= 0 && s.cursor < n, "PackedLoader::set_state: epoch ", s.epoch, " cursor ",
             s.cursor, " is outside this rank's shard of ", n, " documents (was the data or world size changed?)");
  std::vector<int64_t> order = shuffled_order(n, seed_, s.epoch);
  const int64_t length = static_cast<int64_t>(examples_[order[s.cursor]].ids.size());
  LOOM_CHECK(s.offset >= 0 && s.offset < length, "PackedLoader::set_state: offset ", s.offset,
             " is outside document ", s.cursor, " of epoch ", s.epoch, " (", length, " tokens)");
  state_ = s;
  order_ = std::move(order);
}

int64_t PackedLoader::steps_per_epoch() const { return steps_per_epoch_; }

}  // namespace loom
