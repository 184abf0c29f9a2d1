// The objective seam (train/objective.h): what SFT counts and how an unknown objective is refused.
// Its loss is the trainer's: the e2e tests (eval loss against an f64 per-document reference,
// ranks against one process, resume bit for bit) run through it.
#include "train/objective.h"
#include "train/pair_loader.h"

#include <gtest/gtest.h>

namespace loom {
namespace {

TEST(Objective, SftCountsTheTargetTokens) {
  auto sft = make_objective("sft");
  ASSERT_TRUE(sft.ok()) << sft.status();
  EXPECT_EQ((*sft)->name(), "sft");
  // Two documents packed into a row of 8: labels -100 on the first token of each and on padding.
  std::vector<Example> docs = {{{5, 6, 7}, {0, 1, 1}}, {{8, 9, 10, 11}, {0, 0, 1, 1}}};
  PackedLoader loader(docs, 8, 1, 42, 0, 1, 0);
  const Batch b = loader.next();
  EXPECT_EQ((*sft)->units(b), b.target_tokens);
  EXPECT_EQ(b.target_tokens, 4);
}

TEST(Objective, AnUnknownOneNamesThoseThereAre) {
  auto bad = make_objective("sgd");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("unknown objective 'sgd' (there is: sft, dpo, ipo, simpo, orpo)"),
            std::string::npos)
      << bad.status();
}

// A preference objective's units are the batch's pairs (its loss is a mean over them); the pair
// loader keeps both sequences of a pair in one batch, chosen rows first.
TEST(Objective, PreferenceCountsPairs) {
  auto dpo = make_objective("dpo");
  ASSERT_TRUE(dpo.ok()) << dpo.status();
  EXPECT_EQ((*dpo)->name(), "dpo");
  std::vector<PreferenceExample> pairs = {{{1, 2}, {3, 4, 5}, {6}}, {{7}, {8}, {9, 10}}, {{11, 12, 13}, {14}, {15}}};
  PairLoader loader(pairs, 2, 42, 0);
  const Batch b = loader.next();
  EXPECT_EQ(b.pairs, 2);
  EXPECT_EQ((*dpo)->units(b), 2);
  ASSERT_EQ(b.input_ids.size(0), 4);
  // Row i and row i + 2 are one pair: the same prompt, their completions as labels, the rest -100.
  const std::vector<int32_t> ids = b.input_ids.to_ints(), labels = b.labels.to_ints();
  const int64_t S = b.input_ids.size(1);
  for (int64_t i = 0; i < 2; ++i) {
    int64_t prompt = 0;
    while (prompt < S && labels[i * S + prompt] == -100) ++prompt;
    for (int64_t k = 0; k < prompt; ++k) EXPECT_EQ(ids[i * S + k], ids[(i + 2) * S + k]);
  }
  int64_t labelled = 0;
  for (int32_t l : labels) labelled += l != -100;
  EXPECT_EQ(b.target_tokens, labelled);
  const Batch last = loader.next();  // the epoch's short last batch: one pair
  EXPECT_EQ(last.pairs, 1);
  EXPECT_EQ(loader.state().epoch, 1);
}

}  // namespace
}  // namespace loom
