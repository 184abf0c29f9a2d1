// `loom train --checkpointing none|recompute|offload` on the CPU: the three modes run the same
// arithmetic (recompute re-runs each decoder layer with the same seeds; offload keeps CPU tensors
// where they are), so the losses and the adapter bytes must be identical, not merely close.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "tests/e2e/cli.h"
#include "tests/e2e/train_dirs.h"

namespace loom::test {
namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(TrainCheckpointing, ModesGiveIdenticalLossesAndAdapters) {
  const std::string data = kSrc + "/examples/demo/weaving.jsonl";
  std::vector<std::vector<double>> losses;
  std::vector<std::string> adapters;
  for (const char* mode : {"none", "recompute", "offload"}) {
    const std::string out = fresh_dir(std::string("ckpt_") + mode);
    // Dropout on: recomputation must regenerate the same masks.
    RunResult r = run_loom("train --model " + base_model() + " --data " + data + " --out " + out +
                           " --seq-len 64 --batch-size 2 --grad-accum 2 --max-steps 4 --lr 5e-3 --lora-r 8" +
                           " --lora-dropout 0.1 --dtype f32 --quiet --checkpointing " + mode);
    ASSERT_EQ(r.exit_code, 0) << mode << ": " << r.output;
    losses.push_back(metric_losses(out));
    adapters.push_back(read_bytes(out + "/adapter_model.safetensors"));
    ASSERT_EQ(losses.back().size(), 4u) << mode;
    ASSERT_FALSE(adapters.back().empty()) << mode;
  }
  EXPECT_EQ(losses[1], losses[0]) << "recompute";
  EXPECT_EQ(losses[2], losses[0]) << "offload";
  EXPECT_TRUE(adapters[1] == adapters[0]) << "recompute: adapter bytes differ";
  EXPECT_TRUE(adapters[2] == adapters[0]) << "offload: adapter bytes differ";
}

TEST(TrainCheckpointing, UnknownModeIsAClearError) {
  RunResult r = run_loom("train --model " + base_model() + " --data " + kSrc + "/examples/demo/weaving.jsonl --out " +
                         fresh_dir("ckpt_bad") + " --checkpointing sometimes");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--checkpointing must be auto, none, recompute or offload"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom::test
