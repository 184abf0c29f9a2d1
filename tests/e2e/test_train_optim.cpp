// `loom train --optim adamw8bit` end to end on the CPU: LoRA and full fine-tuning stopped and
// resumed reproduce the uninterrupted run's losses exactly, the checkpoint holds 8-bit state, and
// resuming with another optimizer is refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/tensor_io.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cli.h"
#include "tests/e2e/train_dirs.h"

namespace loom::test {
namespace {
namespace fs = std::filesystem;

std::string args(const std::string& out, const std::string& mode) {
  return "train --model " + base_model() + " --data " + kSrc + "/examples/demo/weaving.jsonl --out " + out +
         " --seq-len 64 --batch-size 2 --max-steps 8 --lr 5e-3 --warmup 2 --weight-decay 0.1 --dtype f32 --quiet " +
         mode;
}

void expect_exact_resume(const std::string& name, const std::string& mode) {
  const std::string whole = fresh_dir(name + "_whole"), split = fresh_dir(name + "_split");
  RunResult r = run_loom(args(whole, mode));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_loom(args(split, mode) + " --stop-after 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto tensors = load_tensors(split + "/checkpoint-3/optimizer.safetensors");
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  bool any_8bit = false;
  for (const auto& [n, t] : *tensors) any_8bit |= n.rfind("state1.", 0) == 0 && t.dtype() == DType::u8;
  EXPECT_TRUE(any_8bit) << "no tensor of 4096+ elements got 8-bit state";
  EXPECT_TRUE(tensors->contains("qmap1"));
  r = run_loom(args(split, mode) + " --resume " + split);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto a = metric_losses(split), b = metric_losses(whole);
  EXPECT_EQ(a.size(), 8u);
  EXPECT_EQ(a, b);
  EXPECT_LT(b.back(), b.front());
}

TEST(TrainOptim, LoraAdamW8bitResumesExactly) {
  expect_exact_resume("lora", "--optim adamw8bit --lora-r 8 --lora-targets q_proj,v_proj,lm_head");
}
TEST(TrainOptim, FullAdamW8bitResumesExactly) { expect_exact_resume("full", "--optim adamw8bit --full"); }

TEST(TrainOptim, ResumeWithAnotherOptimizerIsRefused) {
  const std::string out = fresh_dir("switch");
  RunResult r = run_loom(args(out, "--optim adamw8bit --stop-after 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_loom(args(out, "--optim adamw --resume " + out));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--optim adamw (the run has adamw8bit)"), std::string::npos) << r.output;
  r = run_loom(args(fresh_dir("bad"), "--optim sgd"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--optim must be adamw or adamw8bit, got 'sgd'"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom::test
