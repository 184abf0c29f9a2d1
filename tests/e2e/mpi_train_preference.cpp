// `mpirun -np 2 loom train --objective dpo --dist ddp|zero2` on CPU processes (label mpi): pairs are
// sliced over the ranks as rows are (each rank both sides of its pairs), so the per-step losses, the
// TRL measures and the held-out loss are those of one process with the same global batch; so are
// they with the reference precomputed (each rank scores part of the pairs, the table is summed).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "tests/e2e/train_dirs.h"

namespace loom::test {
namespace {

const std::string kPairs = kSrc + "/examples/data/preference_demo.jsonl";
const std::string kMpi = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 mpirun --oversubscribe ";

RunResult run_sh(const std::string& cmd) { return run_command(cmd + " 2>&1"); }

// 80 pairs to train on and 20 held out (the demo file's last ones), written once.
const std::string& split_dir() {
  static const std::string dir = [] {
    const std::string d = fresh_dir("mpi_pref_data");
    std::filesystem::create_directories(d);
    std::ifstream in(kPairs);
    std::ofstream train(d + "/train.jsonl"), held(d + "/held.jsonl");
    int n = 0;
    for (std::string line; std::getline(in, line); ++n) (n < 80 ? train : held) << line << "\n";
    return d;
  }();
  return dir;
}

std::string args(const std::string& out, const std::string& objective, int batch) {
  return "train --model " + base_model() + " --data " + split_dir() + "/train.jsonl --eval-data " + split_dir() +
         "/held.jsonl --eval-every 3 --out " + out + " --objective " + objective + " --batch-size " +
         std::to_string(batch) + " --grad-accum 2 --max-steps 6 --lr 5e-3 --seq-len 128 --seed 5 --quiet --dist-timeout 60";
}

// f32: the ranks add their parts of the gradients and sums in another order than one process.
void expect_near(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0, std::abs(want[i]))) << what << " value " << i + 1;
}

TEST(MpiTrainPreference, TwoRanksMatchOneProcessWithTheSameGlobalBatch) {
  for (const char* objective : {"dpo", "orpo"}) {
    const std::string one = fresh_dir(std::string("mpi_pref_one_") + objective);
    RunResult r = run_sh("OMP_NUM_THREADS=1 " + std::string(LOOM_BINARY) + " " + args(one, objective, 4));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const char* mode : {"ddp", "zero2"}) {
      const std::string two = fresh_dir(std::string("mpi_pref_two_") + objective + mode);
      r = run_sh(kMpi + "-np 2 " + LOOM_BINARY + " " + args(two, objective, 2) + " --dist " + mode);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const std::string what = std::string(objective) + " " + mode;
      expect_near(metric_losses(two), metric_losses(one), what + " loss");
      ASSERT_EQ(metric_values(one, "eval_loss").size(), 2u);
      expect_near(metric_values(two, "eval_loss"), metric_values(one, "eval_loss"), what + " eval_loss");
      for (const char* k : {"rewards/margins", "rewards/accuracies", "logps/chosen", "eval_rewards/accuracies"})
        expect_near(metric_values(two, k), metric_values(one, k), what + " " + k);
    }
  }
}

TEST(MpiTrainPreference, PrecomputedReferenceOverTwoRanksMatchesOneProcess) {
  const std::string one = fresh_dir("mpi_pref_pre_one"), two = fresh_dir("mpi_pref_pre_two");
  RunResult r = run_sh("OMP_NUM_THREADS=1 " + std::string(LOOM_BINARY) + " " + args(one, "dpo", 4));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_sh(kMpi + "-np 2 " + LOOM_BINARY + " " + args(two, "dpo", 2) + " --dist ddp --precompute-ref");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_near(metric_losses(two), metric_losses(one), "loss");
  expect_near(metric_values(two, "eval_loss"), metric_values(one, "eval_loss"), "eval_loss");
}

}  // namespace
}  // namespace loom::test
