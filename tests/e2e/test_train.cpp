// `loom train` end to end on the CPU: the loss falls, a run stopped and resumed reproduces the
// uninterrupted run's losses exactly, the saved adapter reproduces the trainer's logits, and bad
// input is a clear message with a non-zero exit and no checkpoint left half-written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "models/lora.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cli.h"
#include "tests/e2e/train_dirs.h"
#include "train/trainer.h"

namespace loom::test {
namespace {
namespace fs = std::filesystem;

const std::string kData = kSrc + "/examples/demo/weaving.jsonl";

std::string train_args(const std::string& out, int steps) {
  return "train --model " + base_model() + " --data " + kData + " --out " + out + " --seq-len 64 --batch-size 2" +
         " --max-steps " + std::to_string(steps) + " --lr 5e-3 --schedule linear --warmup 2 --lora-r 8 --lora-alpha 16" +
         " --lora-dropout 0.1 --lora-targets q_proj,v_proj,down_proj,lm_head --dtype f32 --quiet";
}

TEST(Train, LossFallsAndOutputsAreWritten) {
  const std::string out = fresh_dir("falls");
  RunResult r = run_loom(train_args(out, 30));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto losses = metric_losses(out);
  ASSERT_EQ(losses.size(), 30u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += losses[i] / 5, last += losses[25 + i] / 5;
  EXPECT_LT(last, first - 0.5) << "mean loss of the first 5 steps " << first << ", last 5 " << last;
  for (const char* f : {"adapter_config.json", "adapter_model.safetensors", "loss.svg", "checkpoint-30/trainer_state.json",
                        "checkpoint-30/optimizer.safetensors", "checkpoint-30/adapter_model.safetensors"})
    EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
  std::string first_line;
  std::getline(std::ifstream(out + "/metrics.jsonl") >> std::ws, first_line);
  const auto line = nlohmann::json::parse(first_line);
  for (const char* key : {"step", "loss", "lr", "grad_norm", "target_tokens", "input_tokens", "tokens_per_s", "mem_bytes"})
    EXPECT_TRUE(line.contains(key)) << key << " in " << first_line;
}

TEST(Train, StoppedAndResumedRunGivesTheSameLosses) {
  const std::string whole = fresh_dir("whole"), split = fresh_dir("split");
  RunResult r = run_loom(train_args(whole, 12) + " --grad-accum 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_loom(train_args(split, 12) + " --grad-accum 2 --stop-after 5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(split + "/checkpoint-5/trainer_state.json"));
  EXPECT_EQ(metric_losses(split).size(), 5u);
  r = run_loom(train_args(split, 12) + " --grad-accum 2 --resume " + split);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Same device, same data order, same optimizer state and dropout streams: bit-identical losses.
  EXPECT_EQ(metric_losses(split), metric_losses(whole));
}

// A step's results are read once the next step is queued unless something must see that step first
// (trainer.cpp); --save-every 1 reads every step at once. Both runs write the same metrics, each line
// with its own step's loss, norm, learning rate and data position.
TEST(Train, DeferredReadsWriteTheSameMetricsAsImmediateOnes) {
  const std::string deferred = fresh_dir("deferred"), held = fresh_dir("held");
  RunResult r = run_loom(train_args(deferred, 7));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_loom(train_args(held, 7) + " --save-every 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto lines = [](const std::string& dir) {
    std::vector<nlohmann::json> v;
    std::ifstream f(dir + "/metrics.jsonl");
    for (std::string line; std::getline(f, line);)
      if (!line.empty()) v.push_back(nlohmann::json::parse(line));
    return v;
  };
  const auto a = lines(deferred), b = lines(held);
  ASSERT_EQ(a.size(), 7u);
  ASSERT_EQ(b.size(), 7u);
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* key : {"step", "loss", "lr", "grad_norm", "epoch", "target_tokens", "input_tokens"})
      EXPECT_EQ(a[i][key], b[i][key]) << key << " of line " << i;
}

TEST(Train, ResumeRefusesChangedDataOrderOrSchedule) {
  const std::string out = fresh_dir("resume_guard");
  ASSERT_EQ(run_loom(train_args(out, 6) + " --stop-after 2").exit_code, 0);
  RunResult r = run_loom(train_args(out, 6) + " --seed 7 --resume " + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("seed"), std::string::npos) << r.output;
  r = run_loom(train_args(out, 6) + " --grad-accum 2 --resume " + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--grad-accum 2 (the run has 1)"), std::string::npos) << r.output;
  // (A larger --max-steps extends the run: test_train_resume.cpp.)
}

TEST(Train, StopOnTheLastStepStillWritesTheOutputs) {
  const std::string out = fresh_dir("stop_last");
  ASSERT_EQ(run_loom(train_args(out, 3) + " --stop-after 3").exit_code, 0);
  EXPECT_TRUE(fs::exists(out + "/adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(out + "/loss.svg"));
}

TEST(Train, SavedAdapterReproducesTheTrainersLogits) {
  TrainConfig c;
  c.model_dir = base_model();
  c.data_path = kData;
  c.out_dir = fresh_dir("api");
  c.seq_len = 64;
  c.batch_size = 2;
  c.max_steps = 4;
  c.dtype = DType::f32;
  c.quiet = true;
  auto trainer = Trainer::create(c);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->run().ok());
  auto reloaded = CausalLM::load(base_model(), {DType::f32, Device::cpu()});
  ASSERT_TRUE(reloaded.ok());
  ASSERT_TRUE(load_adapter(**reloaded, c.out_dir).ok());
  const Tensor ids = Tensor::from_ints({5, 17, 300, 9, 1100, 42}, {1, 6});
  ag::NoGradGuard ng;
  const auto a = (*trainer)->model().forward(ids).value().to_floats(), b = (*reloaded)->forward(ids).value().to_floats();
  EXPECT_EQ(a, b);  // f32 weights written and read exactly
}

// --gemm-autotune is the run's: Trainer::create sets ops::set_gemm_autotune from the config, on and
// back off (on the CPU nothing else changes; on CUDA the products time their algorithms, engine/ops.h).
TEST(Train, GemmAutotuneIsTheRunsChoice) {
  for (bool on : {true, false}) {
    TrainConfig c;
    c.model_dir = base_model();
    c.data_path = kData;
    c.out_dir = fresh_dir(on ? "autotune_on" : "autotune_off");
    c.seq_len = 32;
    c.max_steps = 1;
    c.quiet = true;
    c.gemm_autotune = on;
    auto trainer = Trainer::create(c);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    EXPECT_EQ(ops::gemm_autotune(), on);
  }
}

TEST(Train, FullFineTuneWritesAModelThatLoadsAndGenerates) {
  const std::string out = fresh_dir("full");
  const std::string cfg = ::testing::TempDir() + "loom_full_" + std::to_string(getpid()) + ".conf";
  // The same keys as the flags, from a config file; the command line adds --full.
  std::ofstream(cfg) << "# loom train config\nmodel = " << base_model() << "\ndata: " << kData << "\nout = " << out
                     << "\nseq-len = 64\nbatch-size = 2\nmax-steps = 16\nlr = 3e-3\ndtype = bf16\nquiet = true\n";
  RunResult r = run_loom("train --config " + cfg + " --full");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto losses = metric_losses(out);
  ASSERT_EQ(losses.size(), 16u);
  EXPECT_LT(losses.back(), losses.front() - 0.5);
  ASSERT_TRUE(fs::exists(out + "/model.safetensors") && fs::exists(out + "/config.json"));
  EXPECT_FALSE(fs::exists(out + "/adapter_config.json"));
  r = run_loom("generate --model " + out + " --prompt 'The loom' --max-new-tokens 8 --temperature 0 --dtype f32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("The loom", 0), 0u) << r.output;
  EXPECT_GT(r.output.size(), std::string("The loom\n").size()) << "nothing generated";
}

TEST(Train, SigintFinishesTheStepSavesAndExitsZero) {
  const std::string out = fresh_dir("sigint");
  const std::string cmd = std::string(LOOM_BINARY) + " " + train_args(out, 100000) + " > " + out + ".log 2>&1";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until a few steps are logged, then interrupt.
  for (int i = 0; i < 600 && metric_losses(out).size() < 3; ++i) usleep(50 * 1000);
  ASSERT_GE(metric_losses(out).size(), 3u) << "training did not start";
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by a signal";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const int64_t steps = static_cast<int64_t>(metric_losses(out).size());
  EXPECT_TRUE(fs::exists(out + "/checkpoint-" + std::to_string(steps) + "/trainer_state.json"))
      << "no checkpoint for step " << steps;
}

struct Bad {
  std::string what, args, expect;
};

TEST(Train, BadInputIsAClearErrorWithNoCorruptCheckpoint) {
  const std::string tmp = ::testing::TempDir();
  std::ofstream(tmp + "loom_bad.jsonl") << "{\"text\": \"fine\"}\n{\"text\": broken\n";
  std::ofstream(tmp + "loom_empty.jsonl") << "\n\n";
  const std::string unknown = fresh_dir("unknown_arch");
  fs::create_directories(unknown);
  std::ofstream(unknown + "/config.json") << R"({"model_type": "bert", "vocab_size": 10, "hidden_size": 4})";
  // A model whose vocabulary is smaller than its tokenizer's: token ids would be out of range.
  const std::string small = fresh_dir("small_vocab");
  fs::create_directories(small);
  {
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(kSrc + "/examples/demo/model-config/config.json"));
    cfg["vocab_size"] = 512;
    std::ofstream(small + "/config.json") << cfg.dump();
    fs::copy_file(kSrc + "/examples/demo/model-config/tokenizer.json", small + "/tokenizer.json");
  }
  const std::string small_model = fresh_dir("small_model");
  ASSERT_EQ(run_loom("init --from " + small + " --out " + small_model).exit_code, 0);
  // A checkpoint of another model to resume from.
  const std::string other = fresh_dir("other_ckpt");
  {
    const std::string cfgdir = fresh_dir("other_cfg");
    fs::create_directories(cfgdir);
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(kSrc + "/examples/demo/model-config/config.json"));
    cfg["num_hidden_layers"] = 2;
    std::ofstream(cfgdir + "/config.json") << cfg.dump();
    fs::copy_file(kSrc + "/examples/demo/model-config/tokenizer.json", cfgdir + "/tokenizer.json");
    ASSERT_EQ(run_loom("init --from " + cfgdir + " --out " + cfgdir + "/m").exit_code, 0);
    ASSERT_EQ(run_loom("train --model " + cfgdir + "/m --data " + kData + " --out " + other +
                       " --seq-len 32 --max-steps 1 --dtype f32 --quiet").exit_code, 0);
  }
  const std::string out = fresh_dir("bad_out");
  const std::string ok = " --data " + kData + " --out " + out + " --max-steps 2 --seq-len 32 --quiet";
  const std::vector<Bad> cases = {
      {"missing model", "train --model /nonexistent/model" + ok, "/nonexistent/model"},
      {"unknown architecture", "train --model " + unknown + ok, "bert"},
      {"malformed JSONL", "train --model " + base_model() + " --data " + tmp + "loom_bad.jsonl --out " + out + " --seq-len 32",
       "loom_bad.jsonl:2"},
      {"empty dataset", "train --model " + base_model() + " --data " + tmp + "loom_empty.jsonl --out " + out + " --seq-len 32",
       "empty"},
      {"ids beyond vocabulary", "train --model " + small_model + ok, "vocab"},
      {"sequence too long", "train --model " + base_model() + " --data " + kData + " --out " + out + " --seq-len 100000",
       "max_position_embeddings"},
      {"unwritable output", "train --model " + base_model() + " --data " + kData + " --out /proc/loom-out --seq-len 32",
       "/proc/loom-out"},
      {"resume from another model", "train --model " + base_model() + ok + " --resume " + other, "different model"},
      {"bad flag value", "train --model " + base_model() + ok + " --lr fast", "--lr"},
      {"bad schedule", "train --model " + base_model() + ok + " --schedule zigzag", "zigzag"},
      {"LoRA rank past every dimension", "train --model " + base_model() + ok + " --lora-r 60000", "exceeds both sides"},
      {"LoRA rank past any model", "train --model " + base_model() + ok + " --lora-r 100000000",
       "--lora-r must be between 1 and 65536, got '100000000'"},
      {"a batch too large for any memory", "train --model " + base_model() + ok + " --batch-size 99999999999",
       "--batch-size must be between 1 and 1048576"},
      {"a micro-batch past this machine's memory", "train --model " + base_model() + ok + " --batch-size 1000000",
       "one decoder layer's activations of a micro-batch (1000000 x 32 tokens)"},
      {"a step's batches past host memory", "train --model " + base_model() + ok + " --batch-size 4096 --grad-accum 1048576",
       "a step's 1048576 micro-batches"},
  };
  for (const auto& c : cases) {
    RunResult r = run_loom(c.args);
    EXPECT_NE(r.exit_code, 0) << c.what << "\n" << r.output;
    EXPECT_LT(r.exit_code, 128) << c.what << " crashed\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.what << ": message lacks '" << c.expect << "':\n" << r.output;
  }
  // Nothing half-written: no checkpoint folders, no temporary ones.
  if (fs::exists(out)) {
    for (const auto& e : fs::directory_iterator(out))
      EXPECT_EQ(e.path().filename().string().find("checkpoint"), std::string::npos) << e.path();
  }
  // The other run's checkpoint is intact.
  EXPECT_TRUE(fs::exists(other + "/checkpoint-1/optimizer.safetensors"));
}

}  // namespace
}  // namespace loom::test
