// `loom train` as a new user meets it: extending a run with --resume and a larger --max-steps,
// what a resume refuses or warns about, corrupted checkpoints (checksums, fallback to an older
// one), the adapter written at the top of --out when a run is interrupted, leftovers of earlier
// runs, --save-total-limit, and the CLI's habits (help, version, config files, error messages).
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "nlohmann/json.hpp"
#include "tests/e2e/cli.h"
#include "tests/e2e/train_dirs.h"

namespace loom::test {
namespace {
namespace fs = std::filesystem;

const std::string kData = kSrc + "/examples/demo/weaving.jsonl";

std::string args(const std::string& out, int steps, const std::string& data = kData) {
  return "train --model " + base_model() + " --data " + data + " --out " + out + " --seq-len 64 --batch-size 2" +
         " --max-steps " + std::to_string(steps) + " --lr 5e-3 --schedule cosine --lora-r 4 --dtype f32";
}

bool has(const RunResult& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

TEST(TrainResume, ALargerMaxStepsExtendsTheRun) {
  const std::string out = fresh_dir("extend");
  RunResult r = run_loom(args(out, 4) + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_loom(args(out, 7) + " --resume " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "resuming a run of 4 steps as one of 7")) << r.output;
  EXPECT_TRUE(has(r, "cosine schedule now runs over 7 steps")) << r.output;
  EXPECT_EQ(metric_losses(out).size(), 7u);
  // Fewer steps than the checkpoint has done is refused.
  r = run_loom(args(out, 3) + " --resume " + out + " --quiet");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(has(r, "past this run's 3 steps")) << r.output;
}

TEST(TrainResume, ChangedDataIsRefusedChangedHyperparametersWarned) {
  const std::string out = fresh_dir("guard");
  ASSERT_EQ(run_loom(args(out, 6) + " --stop-after 2 --quiet").exit_code, 0);
  const std::string other = fresh_dir("guard_data") + ".jsonl";
  {
    std::ifstream in(kData);
    std::ofstream o(other);
    o << in.rdbuf() << "{\"text\": \"one more line changes the data\"}\n";
  }
  RunResult r = run_loom(args(out, 6, other) + " --resume " + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(has(r, "data = ")) << r.output;
  EXPECT_TRUE(has(r, "is not the data it was trained on")) << r.output;
  r = run_loom(args(out, 6) + " --lr 1e-3 --warmup 1 --weight-decay 0.1 --schedule linear --resume " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* key : {"--lr ", "--warmup ", "--weight-decay ", "--schedule "})
    EXPECT_TRUE(has(r, std::string("warning: resuming ")) && has(r, key)) << key << "\n" << r.output;
}

// `loom train --resume RUN` alone continues with the settings the run stored: the losses are those
// of the run trained without a stop. Flags that may change are taken; ones that may not are refused,
// every one named at once.
TEST(TrainResume, TheRunFolderAloneResumesWithItsStoredSettings) {
  const std::string whole = fresh_dir("by_folder_whole"), out = fresh_dir("by_folder");
  ASSERT_EQ(run_loom(args(whole, 6) + " --quiet").exit_code, 0);
  ASSERT_EQ(run_loom(args(out, 6) + " --stop-after 2 --quiet").exit_code, 0);
  RunResult r = run_loom("train --resume " + out + " --stop-after 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "resumed from " + out + "/checkpoint-2 at step 2")) << r.output;
  r = run_loom("train --resume " + out + " --seq-len 32 --lora-r 8 --dtype bf16 --max-steps 9");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(has(r, "--lora-r 8 (the run has 4), --seq-len 32 (the run has 64), --dtype bf16 (the run has f32)")) << r.output;
  EXPECT_TRUE(has(r, "may not change in a resumed run")) << r.output;
  r = run_loom("train --resume " + out + " --quiet");  // the rest of the run
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(metric_losses(out), metric_losses(whole));
}

// Before step 1 a run says what it is about to do.
TEST(TrainResume, ARunSaysWhatItWillDoBeforeTheFirstStep) {
  const std::string out = fresh_dir("summary");
  RunResult r = run_loom(args(out, 2) + " --grad-accum 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"data: ", "examples read", "targets", "rows of 64 tokens per epoch after packing",
                           "steps: ", "per epoch; 2 in total (--max-steps)", "a step: 4 rows = --batch-size 2 x --grad-accum 2",
                           "training: LoRA r4 of llama", "trainable", "f32, adamw on cpu",
                           "memory: --checkpointing none; expected peak about", "options: "})
    EXPECT_TRUE(has(r, line)) << line << "\n" << r.output;
  EXPECT_LT(r.output.find("memory: "), r.output.find("step 1/2")) << r.output;
}

TEST(TrainResume, CorruptedCheckpointFallsBackToTheLastGoodOne) {
  const std::string out = fresh_dir("corrupt");
  ASSERT_EQ(run_loom(args(out, 8) + " --save-every 2 --stop-after 4 --quiet").exit_code, 0);
  ASSERT_TRUE(fs::exists(out + "/checkpoint-4/checksums.json"));
  {  // flip a few bytes in the middle of the newest optimizer state
    const std::string f = out + "/checkpoint-4/optimizer.safetensors";
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(fs::file_size(f) / 2));
    io.write("\xff\xff\xff\xff", 4);
  }
  RunResult r = run_loom(args(out, 8) + " --resume " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "checkpoint-4/optimizer.safetensors: checksum mismatch")) << r.output;
  EXPECT_TRUE(has(r, "falling back")) << r.output;
  EXPECT_TRUE(has(r, "checkpoint-2 at step 2")) << r.output;
  // Naming the corrupted checkpoint itself is an error, not a silent resume.
  ASSERT_EQ(run_loom(args(out, 8) + " --save-every 2 --stop-after 2 --quiet --overwrite").exit_code, 0);  // a fresh run
  ASSERT_TRUE(fs::exists(out + "/checkpoint-2/optimizer.safetensors"));
  {
    std::fstream io(out + "/checkpoint-2/adapter_model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(-4, std::ios::end);
    io.write("\x01\x02\x03\x04", 4);
  }
  r = run_loom(args(out, 8) + " --resume " + out + "/checkpoint-2 --quiet");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(has(r, "adapter_model.safetensors: checksum mismatch")) << r.output;
}

// A checkpoint's position fields are counts: a string or a negative step (in a checkpoint without
// checksums.json, as older versions wrote) is refused naming the file and the field.
TEST(TrainResume, TrainerStateFieldsAreChecked) {
  const std::string out = fresh_dir("state_fields");
  ASSERT_EQ(run_loom(args(out, 2) + " --save-every 1 --quiet").exit_code, 0);
  const std::string ck = out + "/checkpoint-1";
  fs::remove(ck + "/checksums.json");
  for (const std::string step : {"\"1\"", "-5"}) {
    nlohmann::json state = nlohmann::json::parse(std::ifstream(ck + "/trainer_state.json"));
    state["step"] = nlohmann::json::parse(step);
    std::ofstream(ck + "/trainer_state.json") << state.dump();
    RunResult r = run_loom(args(fresh_dir("state_fields_run"), 3) + " --resume " + ck + " --quiet --no-verify");
    EXPECT_NE(r.exit_code, 0) << step;
    EXPECT_TRUE(has(r, ck + "/trainer_state.json: \"step\" must be a whole number >= 0, got " + step)) << r.output;
  }
}

TEST(TrainResume, InterruptedRunLeavesTheAdapterAtTheTopOfOut) {
  const std::string out = fresh_dir("interrupted");
  RunResult r = run_loom(args(out, 10) + " --stop-after 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out + "/adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(out + "/adapter_config.json"));
}

TEST(TrainResume, AFreshRunClearsLeftoversOfAnEarlierOne) {
  const std::string out = fresh_dir("leftovers");
  ASSERT_EQ(run_loom(args(out, 3) + " --save-every 1 --quiet").exit_code, 0);
  // A save killed midway leaves .checkpoint-N.tmp.PID; find a pid that is not running.
  int dead = 4000000;
  while (kill(dead, 0) == 0) --dead;
  fs::create_directories(out + "/.checkpoint-9.tmp." + std::to_string(dead));
  // A fresh run that fails before training (here: its data file is missing) clears the killed
  // save's folder at its start but removes nothing the earlier run saved.
  RunResult failed = run_loom(args(out, 2, "/nonexistent/data.jsonl") + " --overwrite");
  ASSERT_NE(failed.exit_code, 0) << failed.output;
  EXPECT_TRUE(has(failed, "removed 1 leftover folder(s)")) << failed.output;
  for (int step = 1; step <= 3; ++step) EXPECT_TRUE(fs::exists(out + "/checkpoint-" + std::to_string(step)));
  // A fresh run into the folder of an earlier one is refused unless it replaces it (--overwrite),
  // and removes nothing; with --overwrite it removes the earlier run's checkpoints when it first saves.
  RunResult r = run_loom(args(out, 2));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(has(r, "--out " + out + " holds an earlier run (adapter_model.safetensors, checkpoint-1, checkpoint-2, ...)"))
      << r.output;
  EXPECT_TRUE(has(r, "--resume " + out + " continues it, --overwrite replaces it")) << r.output;
  for (int step = 1; step <= 3; ++step) EXPECT_TRUE(fs::exists(out + "/checkpoint-" + std::to_string(step)));
  r = run_loom(args(out, 2) + " --overwrite");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "removed 3 checkpoint folder(s) of an earlier run")) << r.output;
  EXPECT_FALSE(fs::exists(out + "/checkpoint-3"));
  EXPECT_FALSE(fs::exists(out + "/.checkpoint-9.tmp." + std::to_string(dead)));
  EXPECT_TRUE(fs::exists(out + "/checkpoint-2"));
}

TEST(TrainResume, SaveTotalLimitKeepsTheNewest) {
  const std::string out = fresh_dir("limit");
  ASSERT_EQ(run_loom(args(out, 5) + " --save-every 1 --save-total-limit 2 --quiet").exit_code, 0);
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) kept.push_back(e.path().filename().string());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"checkpoint-4", "checkpoint-5"}));
}

TEST(TrainCli, BadValuesAreRefusedNamingTheFlag) {
  const std::string out = fresh_dir("bad_values");
  for (const std::string flag : {"--warmup -5", "--weight-decay -1", "--max-grad-norm -1", "--save-total-limit -1"}) {
    RunResult r = run_loom(args(out, 2) + " " + flag + " --quiet");
    EXPECT_NE(r.exit_code, 0) << flag;
    EXPECT_TRUE(has(r, flag.substr(0, flag.find(' ')) + " must be ")) << r.output;
    EXPECT_TRUE(has(r, "at least 0") || has(r, "between 0 and")) << r.output;
    EXPECT_TRUE(has(r, "got '" + flag.substr(flag.find(' ') + 1) + "'")) << r.output;
  }
  for (const std::string flag : {"--save-every -1", "--stop-after -2", "--log-every 0"}) {
    RunResult r = run_loom(args(out, 2) + " " + flag + " --quiet");
    EXPECT_NE(r.exit_code, 0) << flag;
    const std::string name = flag.substr(0, flag.find(' '));
    EXPECT_TRUE(has(r, name + (name == "--log-every" ? " must be between 1 and" : " must be between 0 and"))) << r.output;
  }
  {
    RunResult r = run_loom(args(out, 2) + " --lora-targets q_proj,,v_proj --quiet");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(has(r, "--lora-targets has an empty module name (a stray comma?), got 'q_proj,,v_proj'")) << r.output;
  }
  // A data file that cannot be opened says why.
  RunResult r = run_loom(args(out, 2, "/nonexistent/data.jsonl") + " --quiet");
  EXPECT_TRUE(has(r, "No such file or directory")) << r.output;
  r = run_loom(args(out, 2, kSrc + "/examples") + " --quiet");
  EXPECT_TRUE(has(r, "Is a directory")) << r.output;
  // A model folder without tokenizer.json.
  const std::string no_tok = fresh_dir("no_tokenizer");
  fs::create_directories(no_tok);
  fs::copy_file(base_model() + "/config.json", no_tok + "/config.json");
  fs::copy_file(base_model() + "/model.safetensors", no_tok + "/model.safetensors");
  r = run_loom("train --model " + no_tok + " --data " + kData + " --out " + out + " --seq-len 64 --max-steps 1 --quiet");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(has(r, "no tokenizer.json in this folder")) << r.output;
  EXPECT_FALSE(has(r, "internal error")) << r.output;
}

TEST(TrainCli, SkipBadLinesSaysHowMany) {
  const std::string data = fresh_dir("skip") + ".jsonl";
  std::ofstream(data) << "{\"text\": \"The loom weaves.\"}\nnot json\n{\"text\": 3}\n{\"text\": \"Threads.\"}\n";
  RunResult r = run_loom(args(fresh_dir("skip_out"), 1, data) + " --skip-bad-lines");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "skipped 2 bad line(s) of 4")) << r.output;
}

TEST(TrainCli, ConfigFilesTakeBareSwitchesAndNameUnknownKeys) {
  const std::string out = fresh_dir("cfg");
  const std::string cfg = fresh_dir("cfg_file") + ".conf";
  std::ofstream(cfg) << "model = " << base_model() << "\ndata = " << kData << "\nout = " << out
                     << "\nseq-len = 32\nmax-steps = 1\nfull\nquiet: yes\nrslora = no\n";
  RunResult r = run_loom("train --config " + cfg);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out + "/model.safetensors")) << "`full` was not taken as full = true";
  std::ofstream(cfg) << "model = " << base_model() << "\n\nseq_len = 32\n";
  r = run_loom("train --config " + cfg);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(has(r, cfg + ":3: unknown key 'seq_len' (did you mean 'seq-len'?)")) << r.output;
  std::ofstream(cfg) << "full = maybe\n";
  r = run_loom("train --config " + cfg);
  EXPECT_TRUE(has(r, cfg + ":1: 'full' is a switch")) << r.output;
}

TEST(TrainCli, HelpVersionAndInit) {
  for (const std::string cmd : {"--help", "-h", "help"}) {
    RunResult r = run_loom(cmd + " 2>/dev/null; exit $?");  // help asked for goes to stdout
    EXPECT_EQ(r.exit_code, 0) << cmd;
    EXPECT_TRUE(has(r, "usage: loom <command>")) << cmd << ": " << r.output;
  }
  for (const std::string cmd : {"help train", "train -h", "train --help"}) {
    RunResult r = run_loom(cmd + " 2>/dev/null; exit $?");
    EXPECT_EQ(r.exit_code, 0) << cmd;
    EXPECT_TRUE(has(r, "--save-total-limit")) << cmd << ": " << r.output;
  }
  RunResult r = run_loom("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output.rfind("loom ", 0), 0u) << r.output;
  r = run_loom("init --from " + kSrc + "/examples/demo/model-config --out " + fresh_dir("init"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "written as bf16")) << r.output;
}

}  // namespace
}  // namespace loom::test
