// `loom train --offload-optimizer` end to end on the CPU: the f32 masters and optimizer state live
// in (pinned) host memory, gradients go through the staging buffers and the new weights come back
// through the upload path. On the CPU every copy is exact and the update runs the same kernels, so
// the losses, the adapter or model bytes and the optimizer checkpoint bytes must equal the normal
// run's bit for bit (LoRA and --full, adamw and adamw8bit), and a stopped offloaded run resumes
// exactly (its checkpoint comes from the host copies), also without offload and the other way.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/e2e/cli.h"
#include "tests/e2e/train_dirs.h"

namespace loom::test {
namespace {
namespace fs = std::filesystem;

std::string args(const std::string& out, const std::string& mode) {
  // --grad-accum 2 and clipping (max-grad-norm 0.5) so the gradient scale reaches the host update.
  return "train --model " + base_model() + " --data " + kSrc + "/examples/demo/weaving.jsonl --out " + out +
         " --seq-len 64 --batch-size 2 --grad-accum 2 --max-steps 6 --lr 5e-3 --warmup 2 --weight-decay 0.1" +
         " --max-grad-norm 0.5 --quiet " + mode;
}

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void expect_same_file(const std::string& a, const std::string& b) {
  const std::string x = bytes_of(a), y = bytes_of(b);
  EXPECT_FALSE(x.empty()) << a;
  EXPECT_TRUE(x == y) << a << " and " << b << " differ";
}

// The run with and without offload: same losses, outputs and optimizer checkpoint, bit for bit.
void expect_same_as_without_offload(const std::string& name, const std::string& mode, bool full) {
  const std::string plain = fresh_dir(name + "_plain"), off = fresh_dir(name + "_offload");
  RunResult r = run_loom(args(plain, mode));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_loom(args(off, mode + " --offload-optimizer"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto a = metric_losses(plain), b = metric_losses(off);
  EXPECT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);
  expect_same_file(plain + (full ? "/model.safetensors" : "/adapter_model.safetensors"),
                   off + (full ? "/model.safetensors" : "/adapter_model.safetensors"));
  expect_same_file(plain + "/checkpoint-6/optimizer.safetensors", off + "/checkpoint-6/optimizer.safetensors");
}

TEST(TrainOffload, LoraAdamWEqualsTheDeviceOptimizer) {
  expect_same_as_without_offload("lora_adamw", "--lora-r 8 --lora-targets q_proj,v_proj,lm_head --dtype f32", false);
}
TEST(TrainOffload, LoraAdamW8bitEqualsTheDeviceOptimizer) {
  expect_same_as_without_offload("lora_8bit", "--optim adamw8bit --lora-r 8 --lora-targets q_proj,v_proj,lm_head --dtype f32",
                                 false);
}
// bf16 weights: f32 masters apart from the weights, new weights staged in bf16.
TEST(TrainOffload, FullAdamWEqualsTheDeviceOptimizer) {
  expect_same_as_without_offload("full_adamw", "--full --dtype bf16", true);
}
TEST(TrainOffload, FullAdamW8bitEqualsTheDeviceOptimizer) {
  expect_same_as_without_offload("full_8bit", "--full --optim adamw8bit --dtype bf16", true);
}

TEST(TrainOffload, StoppedRunsResumeExactlyWithOrWithoutOffload) {
  for (const std::string& mode : {std::string("--optim adamw8bit --lora-r 8 --lora-targets q_proj,v_proj,lm_head --dtype f32"),
                                 std::string("--full --dtype bf16")}) {
    const std::string whole = fresh_dir("resume_whole");
    RunResult r = run_loom(args(whole, mode));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto want = metric_losses(whole);
    // Offloaded, stopped after 3 steps, resumed offloaded: its checkpoint comes from the host copies.
    const std::string split = fresh_dir("resume_split");
    r = run_loom(args(split, mode + " --offload-optimizer --stop-after 3"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string cross = fresh_dir("resume_cross");
    fs::copy(split, cross, fs::copy_options::recursive);
    r = run_loom(args(split, mode + " --offload-optimizer --resume " + split));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(metric_losses(split), want) << mode;
    // The checkpoint is the same as the device optimizer's: it resumes without offload too ...
    r = run_loom(args(cross, mode + " --resume " + cross));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(metric_losses(cross), want) << mode;
    // ... and a device optimizer's checkpoint resumes offloaded.
    const std::string back = fresh_dir("resume_back");
    r = run_loom(args(back, mode + " --stop-after 2"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run_loom(args(back, mode + " --offload-optimizer --resume " + back));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(metric_losses(back), want) << mode;
  }
}

TEST(TrainOffload, StartLineSaysWhatMovesToTheHost) {
  const std::string out = fresh_dir("summary");
  std::string a = args(out, "--full --dtype bf16 --offload-optimizer --max-steps 1");
  a.replace(a.find(" --quiet"), 8, "");
  const RunResult r = run_loom(a);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--offload-optimizer: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MiB of GPU memory per rank moved to pinned host memory"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom::test
