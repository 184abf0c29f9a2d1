// `loom train --objective dpo|ipo|simpo|orpo` on the repository's demo preference file
// (examples/data/preference_demo.jsonl) with the demo model: the rewards' accuracy and margin rise
// and metrics.jsonl carries TRL's names; an interrupted run resumes to the same numbers; what is not
// built yet is refused by name before anything loads.
#include <gtest/gtest.h>

#include "tests/e2e/cli.h"
#include "tests/e2e/train_dirs.h"

namespace loom::test {
namespace {

const std::string kPairs = kSrc + "/examples/data/preference_demo.jsonl";

std::string dpo_args(const std::string& out, const std::string& objective) {
  return "train --model " + base_model() + " --data " + kPairs + " --out " + out + " --objective " + objective +
         " --batch-size 4 --max-steps 8 --lr 5e-3 --seq-len 128 --seed 5 --quiet";
}

TEST(TrainPreference, DpoRaisesTheRewardMarginAndLogsTrlsNames) {
  const std::string out = fresh_dir("pref_dpo");
  RunResult r = run_loom(dpo_args(out, "dpo"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> loss = metric_losses(out), margin = metric_values(out, "rewards/margins"),
                            acc = metric_values(out, "rewards/accuracies");
  ASSERT_EQ(loss.size(), 8u);
  ASSERT_EQ(margin.size(), 8u);
  // A fresh adapter (B = 0) is its own reference: the first step's loss is log 2 and its margin 0.
  EXPECT_NEAR(loss[0], std::log(2.0), 1e-5);
  EXPECT_NEAR(margin[0], 0.0, 1e-6);
  EXPECT_GT(margin.back(), 1.0);
  EXPECT_LT(loss.back(), 0.3);
  EXPECT_EQ(acc.back(), 1.0);
  for (const char* k : {"rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected"})
    EXPECT_EQ(metric_values(out, k).size(), 8u) << k;
}

TEST(TrainPreference, ReferenceFreeObjectivesTrainToo) {
  for (const char* objective : {"ipo", "simpo", "orpo"}) {
    const std::string out = fresh_dir(std::string("pref_") + objective);
    RunResult r = run_loom(dpo_args(out, objective));
    ASSERT_EQ(r.exit_code, 0) << objective << ": " << r.output;
    const std::vector<double> margin = metric_values(out, "rewards/margins");
    ASSERT_EQ(margin.size(), 8u) << objective;
    EXPECT_GT(margin.back(), margin.front()) << objective;
    if (std::string(objective) == "orpo") EXPECT_EQ(metric_values(out, "nll_loss").size(), 8u);
  }
}

TEST(TrainPreference, AnInterruptedRunResumesToTheSameNumbers) {
  const std::string whole = fresh_dir("pref_whole"), cut = fresh_dir("pref_cut");
  ASSERT_EQ(run_loom(dpo_args(whole, "dpo")).exit_code, 0);
  RunResult r = run_loom(dpo_args(cut, "dpo") + " --stop-after 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_loom("train --resume " + cut + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(metric_losses(cut), metric_losses(whole));
  EXPECT_EQ(metric_values(cut, "rewards/margins"), metric_values(whole, "rewards/margins"));
}

TEST(TrainPreference, WhatIsNotBuiltIsRefusedByName) {
  RunResult r = run_loom(dpo_args(fresh_dir("pref_full"), "dpo") + " --full");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("with --full needs a frozen copy"), std::string::npos) << r.output;
  r = run_loom("train --model " + base_model() + " --data " + kPairs + " --out " + fresh_dir("pref_beta") + " --beta 0.2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("belong to the preference objectives"), std::string::npos) << r.output;
  r = run_loom(dpo_args(fresh_dir("pref_kto"), "kto"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--objective"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom::test
