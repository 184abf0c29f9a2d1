// `loom train --deepspeed ds_config.json` end to end: the Hugging Face docs' ZeRO-2 + CPU-offload
// config trains unchanged (one process: no --dist, the optimizer offloaded), says what it set and
// what it does not use, and the command line wins over the file.
#include <gtest/gtest.h>

#include "tests/e2e/train_dirs.h"

namespace loom::test {
namespace {

TEST(DeepSpeed, TheTutorialConfigTrainsAndTheCommandLineWins) {
  const std::string out = fresh_dir("deepspeed");
  RunResult r = run_loom("train --model " + base_model() + " --data " + kSrc + "/examples/demo/weaving.jsonl --out " + out +
                         " --max-steps 2 --seq-len 64 --schedule linear --deepspeed " + kSrc +
                         "/tests/fixtures/deepspeed/zero2_offload_auto.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--deepspeed "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not used by Loom: steps_per_print, wall_clock_breakdown"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--offload-optimizer"), std::string::npos) << r.output;
  // The command line's --schedule linear, not the file's WarmupLR (constant): the rate decays.
  EXPECT_EQ(r.output.find("--schedule constant"), std::string::npos) << r.output;
  const std::vector<double> lr = metric_values(out, "lr");
  ASSERT_EQ(lr.size(), 2u);
  EXPECT_LT(lr[1], lr[0]);
  r = run_loom("train --model " + base_model() + " --data x.jsonl --out " + fresh_dir("deepspeed_bad") + " --deepspeed");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--deepspeed needs a value"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom::test
