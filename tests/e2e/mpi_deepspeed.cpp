// `mpirun -np 2 loom train --deepspeed ds_config.json` on CPU processes (label mpi): the tutorials'
// ZeRO-2 + CPU-offload config, unchanged, trains as `--dist zero2 --offload-optimizer` does (the same
// losses, bit for bit), and a train_batch_size that disagrees with the world size is refused on the
// ranks, naming the field and the sizes.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/e2e/train_dirs.h"

namespace loom::test {
namespace {

const std::string kMpi =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 ";
const std::string kConfig = kSrc + "/tests/fixtures/deepspeed/zero2_offload_auto.json";

std::string args(const std::string& out) {
  return std::string(LOOM_BINARY) + " train --model " + base_model() + " --data " + kSrc +
         "/examples/demo/weaving.jsonl --out " + out +
         " --seq-len 64 --batch-size 2 --max-steps 4 --lr 5e-3 --lora-r 8 --dtype f32 --quiet --dist-timeout 60";
}

TEST(MpiDeepSpeed, TheTutorialConfigIsZero2WithTheOptimizerOffloaded) {
  const std::string ds = fresh_dir("mpi_ds"), flags = fresh_dir("mpi_ds_flags");
  RunResult r = run_command(kMpi + args(ds) + " --deepspeed " + kConfig + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // What the file sets: ZeRO-2, the optimizer in host memory, WarmupLR (a constant rate after warm-up).
  r = run_command(kMpi + args(flags) + " --dist zero2 --offload-optimizer --schedule constant 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> want = metric_losses(flags);
  ASSERT_EQ(want.size(), 4u);
  EXPECT_EQ(metric_losses(ds), want);
}

TEST(MpiDeepSpeed, TrainBatchSizeIsCheckedAgainstTheWorld) {
  const std::string dir = fresh_dir("mpi_ds_bad");
  std::filesystem::create_directories(dir);
  // 2 ranks x 2 rows x 1 accumulation step = 4, not 6.
  std::ofstream(dir + "/ds.json") << R"({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}})";
  RunResult r = run_command(kMpi + args(dir + "/out") + " --deepspeed " + dir + "/ds.json 2>&1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("train_batch_size"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom::test
