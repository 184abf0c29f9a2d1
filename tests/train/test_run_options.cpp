// The table of run options (train/run_options.h): flags, config keys, defaults, bounds, the stored
// settings of a run and what a resumed run may change.
#include "train/run_options.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "tests/temp_dir.h"

namespace loom {
namespace {

bool contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

GivenOptions parse(const std::vector<std::string>& argv) {
  GivenOptions g;
  EXPECT_TRUE(parse_train_args(argv, OptionSource::kCommandLine, g).ok());
  return g;
}

TEST(RunOptions, EveryDefaultParsesAndRoundTrips) {
  for (const RunOption& o : run_options()) {
    TrainConfig a, b;
    if (!o.default_text.empty()) {
      ASSERT_TRUE(o.set(o.default_text, a).ok()) << o.name;
    }
    ASSERT_TRUE(o.set(o.get(a), b).ok()) << o.name << " = " << o.get(a);
    EXPECT_EQ(o.get(a), o.get(b)) << o.name;
  }
  // The table's defaults are TrainConfig's own, so a config built in code means the same run.
  GivenOptions g = parse({"--model", "m", "--data", "d", "--out", "o"});
  auto built = build_train_config(g);
  ASSERT_TRUE(built.ok()) << built.status();
  TrainConfig plain;
  plain.model_dir = "m", plain.data_path = "d", plain.out_dir = "o";
  EXPECT_EQ(stored_options(*built).dump(), stored_options(plain).dump());
}

TEST(RunOptions, FloatsAndDoublesRoundTripExactly) {
  TrainConfig c;
  c.lr = 1.f / 3.f;
  c.dist_timeout = 0.1;
  TrainConfig d;
  for (const char* name : {"lr", "dist-timeout"}) ASSERT_TRUE(find_run_option(name)->set(find_run_option(name)->get(c), d).ok());
  EXPECT_EQ(d.lr, c.lr);
  EXPECT_EQ(d.dist_timeout, c.dist_timeout);
}

TEST(RunOptions, AMistypedFlagSuggestsTheClosest) {
  GivenOptions g;
  absl::Status s = parse_train_args({"--modle", "x"}, OptionSource::kCommandLine, g);
  EXPECT_TRUE(contains(s, "unknown flag --modle (did you mean --model?)")) << s;
  s = parse_train_args({"--lora-rank", "8"}, OptionSource::kCommandLine, g);
  EXPECT_TRUE(contains(s, "did you mean --lora-r")) << s;
  s = parse_train_args({"--zzzzzzzzzz"}, OptionSource::kCommandLine, g);
  EXPECT_FALSE(contains(s, "did you mean")) << s;
}

TEST(RunOptions, SizesHaveUpperBoundsCheckedBeforeAnythingIsAllocated) {
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"batch-size", "99999999999"}, {"grad-accum", "1000000000000"}, {"seq-len", "99999999999"},
           {"lora-r", "10000000"}, {"epochs", "1000000000000000000"}, {"lr", "inf"}, {"lr", "0"}, {"lora-dropout", "1"}}) {
    GivenOptions g = parse({"--model", "m", "--data", "d", "--out", "o", "--" + flag, value});
    auto built = build_train_config(g);
    ASSERT_FALSE(built.ok()) << flag << " " << value;
    EXPECT_TRUE(contains(built.status(), "--" + flag)) << built.status();
    EXPECT_TRUE(contains(built.status(), value)) << built.status();
  }
}

TEST(RunOptions, DtypeDefaultsToF32OnTheCpuAndBf16OnCuda) {
  GivenOptions g = parse({"--model", "m", "--data", "d", "--out", "o"});
  auto cpu = build_train_config(g);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->resolved_dtype(), DType::f32);
  g.values["device"] = {"cuda", OptionSource::kCommandLine};
  auto cuda = build_train_config(g);
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ(cuda->resolved_dtype(), DType::bf16);
}

TEST(RunOptions, AResumedRunTakesItsStoredSettingsAndRefusesEveryFixedChangeAtOnce) {
  TrainConfig was;
  was.model_dir = "/m", was.data_path = "/d", was.out_dir = "/o";
  was.seq_len = 256, was.lora.r = 8, was.max_steps = 10, was.log_every = 5, was.skip_bad_lines = true;
  const nlohmann::json stored = stored_options(was);
  GivenOptions g = parse({"--max-steps", "20", "--quiet", "--skip-bad-lines=false"});
  ASSERT_TRUE(merge_stored_options(stored, "run1", g).ok());
  auto c = build_train_config(g);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->seq_len, 256);
  EXPECT_EQ(c->lora.r, 8);
  EXPECT_EQ(c->max_steps, 20);  // may change
  EXPECT_TRUE(c->quiet);        // of this invocation, not stored
  EXPECT_EQ(c->log_every, 5);
  EXPECT_FALSE(c->skip_bad_lines);  // a switch turned off over a stored true
  EXPECT_EQ(c->model_dir, "/m");
  // The same value written another way is no change; two changed fixed settings are named together.
  g = parse({"--seq-len", "0256", "--lr", "0.0002"});
  EXPECT_TRUE(merge_stored_options(stored, "run1", g).ok());
  g = parse({"--seq-len", "512", "--dtype", "bf16", "--max-steps", "5"});
  absl::Status s = merge_stored_options(stored, "run1", g);
  EXPECT_TRUE(contains(s, "cannot resume run1 with --seq-len 512 (the run has 256), --dtype bf16 (the run has f32): these "
                          "settings may not change"))
      << s;
}

TEST(RunOptions, GemmAutotuneIsASwitchOffByDefault) {
  auto off = build_train_config(parse({"--model", "m", "--data", "d", "--out", "o"}));
  auto on = build_train_config(parse({"--model", "m", "--data", "d", "--out", "o", "--gemm-autotune"}));
  ASSERT_TRUE(off.ok() && on.ok());
  EXPECT_FALSE(off->gemm_autotune);
  EXPECT_TRUE(on->gemm_autotune);
}

TEST(RunOptions, WarnedChangesAreTheOptimisationSettings) {
  TrainConfig a, b;
  b.lr = 1e-3f, b.schedule = "cosine", b.max_steps = 7;
  auto changes = warned_changes(stored_options(a), stored_options(b));
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(std::get<0>(changes[0]), "lr");
  EXPECT_EQ(std::get<0>(changes[1]), "schedule");
}

TEST(RunOptions, RanksAgreeOnWhatChangesTheRunNotOnPathsOrOutput) {
  std::set<std::string> names;
  for (const auto& [flag, value] : rank_agreement_fields(TrainConfig{})) names.insert(flag);
  for (const char* must : {"--seq-len", "--batch-size", "--grad-accum", "--seed", "--dtype", "--optim", "--lr", "--dist",
                           "--lora-targets", "--resume", "--max-steps"})
    EXPECT_TRUE(names.count(must)) << must;
  for (const char* free : {"--model", "--data", "--out", "--device", "--quiet", "--log-every"})
    EXPECT_FALSE(names.count(free)) << free;
}

TEST(RunOptions, ConfigFileKeysAreTheOptions) {
  test::TempDir dir;
  const std::string f = dir.path() + "/run.conf";
  std::ofstream(f) << "# a run\nseq-len = 128\nqlora: yes\nquiet = off\nlr = 1e-4 # peak\n";
  auto flags = read_config_file(f);
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(*flags, (std::vector<std::string>{"--seq-len", "128", "--qlora", "--quiet=false", "--lr", "1e-4"}));
  std::ofstream(f) << "seqlen = 5\n";
  auto bad = read_config_file(f);
  EXPECT_TRUE(contains(bad.status(), f + ":1: unknown key 'seqlen' (did you mean 'seq-len'?)")) << bad.status();
}

}  // namespace
}  // namespace loom
