// Pairs into batches (train/pair_loader.h), checked sequence by sequence against the pairs
// themselves: where Batch::seq_start / seq_len say a sequence lies, the rows hold its prompt and
// completion, labels on the completion only, positions from 0 and one segment of its own; packed
// rows hold several sequences without overlap, padded rows one each; rank blocks hold their pairs.
#include "train/pair_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

namespace loom {
namespace {

const std::vector<PreferenceExample> kPairs = {
    {{1, 2}, {3, 4, 5}, {6}},          {{7}, {8}, {9, 10}},         {{11, 12, 13}, {14}, {15}},
    {{16, 17, 18, 19}, {20, 21}, {22}}, {{23}, {24, 25, 26, 27}, {28}}};

// Every check of the header's promises on one batch of pairs which[0..P).
void check_batch(const Batch& b, const std::vector<int64_t>& which, PairLayout layout, int64_t groups) {
  const int64_t P = static_cast<int64_t>(which.size()), rows = b.input_ids.size(0), W = b.input_ids.size(1);
  ASSERT_EQ(b.pairs, P);
  ASSERT_EQ(b.groups, groups);
  ASSERT_EQ(b.seq_start.size(), static_cast<size_t>(2 * P));
  ASSERT_EQ(rows % groups, 0);
  const std::vector<int32_t> ids = b.input_ids.to_ints(), labels = b.labels.to_ints(), pos = b.positions.to_ints(),
                             seg = b.segment_ids.to_ints();
  std::vector<int> owner(rows * W, -1);
  int64_t longest = 0, tokens = 0;
  for (int64_t j = 0; j < 2 * P; ++j) {
    const PreferenceExample& p = kPairs[which[j % P]];
    const std::vector<int32_t>& completion = j < P ? p.chosen : p.rejected;
    const int64_t len = static_cast<int64_t>(p.prompt.size() + completion.size()), start = b.seq_start[j];
    longest = std::max(longest, len);
    tokens += len;
    const int64_t row = start / W;
    // Rank blocks: the pair's block is the one its index falls in.
    const int64_t block = row / (rows / groups);
    EXPECT_TRUE(j % P >= block * P / groups && j % P < (block + 1) * P / groups) << "sequence " << j;
    EXPECT_EQ(b.seq_len[j], layout == PairLayout::kPad ? W : len) << j;
    ASSERT_LE(start % W + len, W) << "sequence " << j << " crosses its row";
    for (int64_t c = 0; c < len; ++c) {
      const int64_t at = start + c;
      EXPECT_EQ(owner[at], -1) << "sequences " << owner[at] << " and " << j << " overlap";
      owner[at] = static_cast<int>(j);
      const bool in_prompt = c < static_cast<int64_t>(p.prompt.size());
      EXPECT_EQ(ids[at], in_prompt ? p.prompt[c] : completion[c - p.prompt.size()]) << j << " " << c;
      EXPECT_EQ(labels[at], in_prompt || c == 0 ? -100 : completion[c - p.prompt.size()]) << j << " " << c;
      if (layout == PairLayout::kPack) {
        EXPECT_EQ(pos[at], c) << j;
        EXPECT_EQ(seg[at], seg[start]) << j;
      } else {
        EXPECT_EQ(pos[at], at % W) << j;  // as transformers numbers a right-padded row
        EXPECT_EQ(seg[at], 0) << j;
      }
    }
  }
  EXPECT_EQ(W, longest);
  EXPECT_EQ(b.tokens, tokens);
  for (int64_t i = 0; i < rows * W; ++i)
    if (owner[i] < 0) {
      EXPECT_EQ(labels[i], -100) << "padding at " << i;
    }
  if (layout == PairLayout::kPack) {
    // Neighbouring sequences of a row have different segments, and padding has its own.
    for (int64_t i = 1; i < rows * W; ++i)
      if (i % W && owner[i] != owner[i - 1]) {
        EXPECT_NE(seg[i], seg[i - 1]) << i;
      }
  } else {
    EXPECT_EQ(rows, groups * 2 * ((P + groups - 1) / groups));
  }
}

TEST(PairBatch, PaddedLayoutIsOneSequenceARow) {
  const std::vector<int64_t> which = {0, 1, 2, 3};
  check_batch(make_pair_batch(kPairs, which, 0, PairLayout::kPad), which, PairLayout::kPad, 1);
}

TEST(PairBatch, PackedLayoutHoldsTheSameSequencesInFewerRows) {
  const std::vector<int64_t> which = {4, 0, 1, 2, 3};
  const Batch b = make_pair_batch(kPairs, which, 0, PairLayout::kPack);
  check_batch(b, which, PairLayout::kPack, 1);
  // Lengths (chosen 5 5 2 4 6, rejected 2 3 3 4 5) into rows of 6, first fit decreasing:
  // 6 | 5 | 5 | 5 | 4 2 | 4 2 | 3 3: 7 rows where padding takes 10.
  EXPECT_EQ(b.input_ids.size(0), 7);
}

TEST(PairBatch, RankBlocksHoldTheirOwnPairs) {
  const std::vector<int64_t> which = {0, 1, 2, 3, 4};  // 5 pairs over 2 ranks: 2 and 3
  for (PairLayout layout : {PairLayout::kPad, PairLayout::kPack})
    check_batch(make_pair_batch(kPairs, which, 0, layout, 2), which, layout, 2);
}

TEST(PairBatch, TheLoaderGivesEveryPairOnceAnEpoch) {
  for (PairLayout layout : {PairLayout::kPad, PairLayout::kPack}) {
    PairLoader loader(kPairs, 2, 7, 0, layout, 1);
    std::multiset<int64_t> seen;
    for (int i = 0; i < loader.steps_per_epoch(); ++i) {
      const Batch b = loader.next();
      check_batch(b, b.pair_ids, layout, 1);
      seen.insert(b.pair_ids.begin(), b.pair_ids.end());
    }
    EXPECT_EQ(seen, (std::multiset<int64_t>{0, 1, 2, 3, 4}));
  }
}

}  // namespace
}  // namespace loom
