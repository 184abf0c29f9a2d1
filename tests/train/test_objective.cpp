// The objective seam (train/objective.h): what SFT counts and how an unknown objective is refused.
// Its loss is the trainer's: the e2e tests (eval loss against an f64 per-document reference,
// ranks against one process, resume bit for bit) run through it.
#include "train/objective.h"

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
  auto dpo = make_objective("sgd");
  ASSERT_FALSE(dpo.ok());
  EXPECT_NE(std::string(dpo.status().message()).find("unknown objective 'sgd' (there is: sft)"), std::string::npos);
}

}  // namespace
}  // namespace loom
