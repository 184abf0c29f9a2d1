// Outputs never go over inputs, and a run that fails loses nothing: every command that writes a
// model, a results file or a run folder refuses, with a message naming both flags and a non-zero
// exit, to write over its own input, over another model's weights or into the checkpoint it
// resumes; the files stay byte for byte as they were. Number flags refuse inf and nan.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "tests/e2e/cli.h"
#include "tests/e2e/train_dirs.h"
#include "tests/models/fixtures.h"

namespace loom::test {
namespace {
namespace fs = std::filesystem;

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

bool has(const RunResult& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

// A copy of the qwen2 fixture (model, tokenizer, adapter) that the commands below may not touch.
std::string model_copy(const std::string& name) {
  const std::string d = fresh_dir(name);
  fs::copy(fixture_dir("qwen2"), d, fs::copy_options::recursive);
  return d;
}

TEST(Outputs, ModelWritersRefuseAFolderHoldingAModel) {
  const std::string m = model_copy("writers");
  const std::string weights = bytes_of(m + "/model.safetensors");
  // init over a trained model (its own --from folder)
  RunResult r = run_loom("init --from " + m + " --out " + m);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(has(r, "--out " + m + " already holds a model")) << r.output;
  // merge into its own --model folder, and into another model's folder
  r = run_loom("merge --model " + m + " --adapter " + m + "/adapter --out " + m);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(has(r, "is --model")) << r.output;
  const std::string other = model_copy("writers_other");
  r = run_loom("merge --model " + m + " --adapter " + m + "/adapter --out " + other);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(has(r, "already holds a model")) << r.output;
  // forward's results file inside the model folder (it would replace the weights)
  r = run_loom("forward --model " + m + " --input " + m + "/inputs.safetensors --output " + m + "/model.safetensors");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(has(r, "--output " + m + "/model.safetensors lies inside --model")) << r.output;
  EXPECT_EQ(bytes_of(m + "/model.safetensors"), weights) << "the model was written over";
  // The same commands into fresh folders work.
  EXPECT_EQ(run_loom("merge --model " + m + " --adapter " + m + "/adapter --out " + fresh_dir("merged")).exit_code, 0);
}

TEST(Outputs, TrainRefusesItsModelFolderAndTheCheckpointItResumes) {
  const std::string out = fresh_dir("train_outputs");
  const std::string data = kSrc + "/examples/demo/weaving.jsonl";
  const std::string common = " --data " + data + " --seq-len 64 --batch-size 2 --lr 5e-3 --lora-r 4 --dtype f32 --quiet";
  RunResult r = run_loom("train --model " + base_model() + " --out " + base_model() + " --max-steps 1" + common);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(has(r, "is the --model folder")) << r.output;
  ASSERT_EQ(run_loom("train --model " + base_model() + " --out " + out + " --max-steps 2 --save-every 1" + common).exit_code, 0);
  const std::string saved = bytes_of(out + "/checkpoint-1/adapter_model.safetensors");
  r = run_loom("train --model " + base_model() + " --out " + out + "/checkpoint-1 --resume " + out + "/checkpoint-1" +
               " --max-steps 2" + common);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(has(r, "lies inside the checkpoint")) << r.output;
  EXPECT_EQ(bytes_of(out + "/checkpoint-1/adapter_model.safetensors"), saved);
  // Resuming into the run's own folder is the normal way.
  r = run_loom("train --model " + base_model() + " --out " + out + " --resume " + out + "/checkpoint-1 --max-steps 3" +
               common);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// A run whose loss turns NaN (a learning rate far too high) ends with an error at that step and
// saves nothing over what it had saved before.
// A full fine-tune into `out` at a learning rate that turns the loss NaN: it must fail naming the
// divergence and save no model. Returns the run's folder.
std::string expect_diverged_run(const std::string& name, const std::string& extra) {
  const std::string out = fresh_dir(name);
  RunResult r = run_loom("train --model " + base_model() + " --data " + kSrc + "/examples/demo/weaving.jsonl --out " + out +
                         " --full --lr 1e30 --max-steps 6 --seq-len 64 --batch-size 2 --dtype f32 --quiet" + extra);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("training diverged"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out + "/model.safetensors")) << "a diverged model was saved as the result";
  return out;
}

TEST(Outputs, ADivergedRunStopsWithAnErrorAndKeepsItsCheckpoints) { expect_diverged_run("diverged", " --save-every 1"); }

// Without checkpoints along the way a step's loss is read once the next step is queued (trainer.cpp):
// the divergence is reported one step late, and still nothing is saved.
TEST(Outputs, ADivergedRunWithDeferredReadsSavesNothing) {
  const std::string out = expect_diverged_run("diverged_deferred", "");
  for (const auto& e : fs::directory_iterator(out))
    EXPECT_EQ(e.path().filename().string().rfind("checkpoint-", 0), std::string::npos) << e.path() << " was saved";
}

TEST(Outputs, NumberFlagsRefuseInfinityAndNan) {
  const std::string common = "train --model " + base_model() + " --data " + kSrc + "/examples/demo/weaving.jsonl --out " +
                             fresh_dir("nonfinite") + " --max-steps 1 --seq-len 64 --quiet";
  for (const std::string flag : {"--lr inf", "--lora-alpha inf", "--weight-decay nan", "--lora-dropout -inf"}) {
    RunResult r = run_loom(common + " " + flag);
    EXPECT_NE(r.exit_code, 0) << flag;
    EXPECT_TRUE(has(r, flag.substr(0, flag.find(' ')) + " expects a finite number")) << flag << ": " << r.output;
  }
}

}  // namespace
}  // namespace loom::test
