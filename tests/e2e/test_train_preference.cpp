// `loom train --objective dpo|ipo|simpo|orpo` on the repository's demo preference file
// (examples/data/preference_demo.jsonl) with the demo model: the rewards' accuracy and margin rise
// and metrics.jsonl carries TRL's names; an interrupted run resumes to the same numbers; the
// reference precomputed or, for full fine-tuning, a frozen copy; held-out pairs; options misplaced
// are refused by name before anything loads.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/tensor_io.h"

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
    if (std::string(objective) == "orpo") {
      EXPECT_EQ(metric_values(out, "nll_loss").size(), 8u);
    }
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

// --precompute-ref scores every pair once under the reference before training (the model with its
// adapters off, as each step would) and keeps the table in the run folder: the losses are those of a
// run that runs the reference each step, and a resumed run reads the table back.
TEST(TrainPreference, PrecomputedReferenceGivesTheSameLossesAndIsReusedOnResume) {
  const std::string each = fresh_dir("pref_each"), pre = fresh_dir("pref_pre");
  ASSERT_EQ(run_loom(dpo_args(each, "dpo")).exit_code, 0);
  RunResult r = run_loom(dpo_args(pre, "dpo") + " --precompute-ref --stop-after 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(pre + "/ref_logps.safetensors"));
  r = run_loom("train --resume " + pre);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("reference: the scores of 100 pairs read from"), std::string::npos) << r.output;
  const std::vector<double> a = metric_losses(each), b = metric_losses(pre);
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  // The reference pass pads its batches (file order) to other lengths than the training batches
  // (shuffled): the same sums, f32, within rounding.
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * std::max(1.0, std::abs(a[i]))) << "step " << i + 1;
  const auto table = load_tensors(pre + "/ref_logps.safetensors");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->at("chosen").shape(), (std::vector<int64_t>{100}));
}

// Full fine-tuning moves every weight, so its reference is a frozen copy of the starting model (or
// the precomputed table of it): both give the same run, the first step's loss log 2.
TEST(TrainPreference, FullFineTuningKeepsAFrozenReference) {
  const std::string copy = fresh_dir("pref_full_copy"), table = fresh_dir("pref_full_table");
  const std::string full = " --full --lr 1e-4 --max-steps 5";
  RunResult r = run_loom(dpo_args(copy, "dpo") + full);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_loom(dpo_args(table, "dpo") + full + " --precompute-ref --stop-after 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_loom("train --resume " + table + " --quiet");  // the table is read back: the weights have moved
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> a = metric_losses(copy), b = metric_losses(table);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  EXPECT_NEAR(a[0], std::log(2.0), 1e-5);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * std::max(1.0, std::abs(a[i]))) << "step " << i + 1;
  EXPECT_LT(a.back(), a.front());
}

// --eval-data in a preference format: the held-out loss and TRL's eval_ measures at each evaluation.
TEST(TrainPreference, EvalDataGivesTheHeldOutLossAndAccuracy) {
  const std::string dir = fresh_dir("pref_eval_data"), out = fresh_dir("pref_eval");
  std::filesystem::create_directories(dir);
  std::ifstream in(kPairs);
  std::ofstream train(dir + "/train.jsonl"), held(dir + "/held.jsonl");
  int n = 0;
  for (std::string line; std::getline(in, line); ++n) (n < 80 ? train : held) << line << "\n";
  train.close(), held.close();
  RunResult r = run_loom("train --model " + base_model() + " --data " + dir + "/train.jsonl --eval-data " + dir +
                         "/held.jsonl --eval-every 4 --out " + out +
                         " --objective dpo --batch-size 4 --max-steps 8 --lr 5e-3 --seq-len 128 --seed 5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> eval = metric_values(out, "eval_loss"), acc = metric_values(out, "eval_rewards/accuracies"),
                            margin = metric_values(out, "eval_rewards/margins");
  ASSERT_EQ(eval.size(), 2u);  // steps 4 and 8
  ASSERT_EQ(acc.size(), 2u);
  ASSERT_EQ(margin.size(), 2u);
  EXPECT_LT(eval[1], eval[0]);
  EXPECT_GT(margin[1], margin[0]);
  EXPECT_NE(r.output.find("(acc "), std::string::npos) << r.output;
}

// --pair-layout pack (the default: a pair's sequences packed into rows, attention within each) and
// pad (a sequence a row) train the same: each sequence's sums do not depend on its neighbours.
TEST(TrainPreference, PackedAndPaddedPairsTrainAlike) {
  const std::string pack = fresh_dir("pref_pack"), pad = fresh_dir("pref_pad");
  RunResult r = run_loom(dpo_args(pack, "orpo"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_loom(dpo_args(pad, "orpo") + " --pair-layout pad");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> a = metric_losses(pack), b = metric_losses(pad);
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::max(1.0, std::abs(b[i]))) << "step " << i + 1;
  // input_tokens counts the real tokens (not the padding): the same either way.
  EXPECT_EQ(metric_values(pack, "input_tokens"), metric_values(pad, "input_tokens"));
}

TEST(TrainPreference, MisplacedOptionsAreRefusedByName) {
  RunResult r = run_loom(dpo_args(fresh_dir("pref_simpo_pre"), "simpo") + " --precompute-ref");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--precompute-ref scores pairs under a reference model"), std::string::npos) << r.output;
  r = run_loom("train --model " + base_model() + " --data " + kPairs + " --out " + fresh_dir("pref_beta") + " --beta 0.2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("belong to the preference objectives"), std::string::npos) << r.output;
  r = run_loom(dpo_args(fresh_dir("pref_kto"), "kto"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--objective"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom::test
