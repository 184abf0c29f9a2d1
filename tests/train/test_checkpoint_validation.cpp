// Training checkpoints are validated like any input: damaged values (NaN or negative second moments,
// negative or impossible step counts, tampered counters) and a missing checksums.json make
// --resume fall back to the previous intact checkpoint with the reason; a checkpoint named directly
// is refused; write_train_checkpoint never writes a NaN. The damage is written before the checksums
// are taken (through write_train_checkpoint's extra_files), so only the value checks can catch it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "engine/tensor_io.h"
#include "train/train_checkpoint.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::string fresh(const std::string& name) {
  const std::string d = ::testing::TempDir() + "loom_ckpt_valid_" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// An AdamW checkpoint of one parameter "w" of 4 values, at `step`, as the trainer writes it.
TrainCheckpoint adamw_checkpoint(int64_t step) {
  TrainCheckpoint c;
  c.state = {{"step", step}, {"total_steps", 10}, {"epoch", 0}, {"cursor", 1}, {"offset", 0}, {"grad_accum", 1}};
  c.tensors["exp_avg.w"] = Tensor::from_floats({0.1f, -0.2f, 0.3f, -0.4f}, {4});
  c.tensors["exp_avg_sq.w"] = Tensor::from_floats({0.01f, 0.04f, 0.09f, 0.16f}, {4});
  c.tensors["master.w"] = Tensor::from_floats({1.f, 2.f, 3.f, 4.f}, {4});
  Tensor s = Tensor::zeros({1}, DType::i64);
  *s.data<int64_t>() = step;
  c.tensors["step.w"] = s;
  return c;
}

using Damage = std::function<void(const std::string& dir, TrainCheckpoint& c)>;

// out/checkpoint-1 intact, out/checkpoint-2 written with `damage` applied to its files before the
// checksums are taken (so they match the damaged bytes).
void write_pair(const std::string& out, const Damage& damage) {
  auto none = [](const std::string&) { return absl::OkStatus(); };
  ASSERT_TRUE(write_train_checkpoint(out, 1, adamw_checkpoint(1), none).ok());
  const TrainCheckpoint good = adamw_checkpoint(2);
  ASSERT_TRUE(write_train_checkpoint(out, 2, good, [&](const std::string& dir) {
                TrainCheckpoint bad = good;
                damage(dir, bad);
                std::ofstream(dir + "/trainer_state.json") << bad.state.dump(2);
                return save_tensors(dir + "/optimizer.safetensors", {bad.tensors.begin(), bad.tensors.end()});
              }).ok());
}

// --resume OUT falls back to checkpoint-1 and says why checkpoint-2 was skipped; --resume
// OUT/checkpoint-2 is refused with the same reason.
void expect_fallback(const std::string& name, const Damage& damage, const std::vector<std::string>& reason) {
  const std::string out = fresh(name);
  write_pair(out, damage);
  auto r = find_resume_checkpoint(out);
  ASSERT_TRUE(r.ok()) << name << ": " << r.status();
  EXPECT_EQ(r->dir, out + "/checkpoint-1") << name;
  ASSERT_EQ(r->skipped.size(), 1u) << name;
  EXPECT_EQ(r->skipped[0].rfind(out + "/checkpoint-2: ", 0), 0u) << r->skipped[0];
  for (const auto& part : reason) EXPECT_NE(r->skipped[0].find(part), std::string::npos) << "'" << part << "' not in: " << r->skipped[0];
  auto direct = read_train_checkpoint(out + "/checkpoint-2");
  ASSERT_FALSE(direct.ok()) << name;
  EXPECT_EQ(direct.status().code(), absl::StatusCode::kDataLoss) << direct.status();
}

void set_float(TrainCheckpoint& c, const std::string& name, int64_t i, float v) {
  std::vector<float> x = c.tensors.at(name).to_floats();
  x[static_cast<size_t>(i)] = v;
  c.tensors[name] = Tensor::from_floats(x, c.tensors.at(name).shape());
}

TEST(CheckpointValidation, IntactPairResumesFromTheNewest) {
  const std::string out = fresh("intact");
  write_pair(out, [](const std::string&, TrainCheckpoint&) {});
  auto r = find_resume_checkpoint(out);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dir, out + "/checkpoint-2");
  EXPECT_TRUE(r->skipped.empty());
}

TEST(CheckpointValidation, NanSecondMomentFallsBack) {
  expect_fallback("nan_sq", [](auto&, TrainCheckpoint& c) { set_float(c, "exp_avg_sq.w", 2, kNaN); },
                  {"optimizer.safetensors", "tensor 'exp_avg_sq.w' holds nan at [2]"});
}

TEST(CheckpointValidation, InfiniteFirstMomentAndMasterFallBack) {
  expect_fallback("inf_m", [](auto&, TrainCheckpoint& c) { set_float(c, "exp_avg.w", 0, -INFINITY); },
                  {"tensor 'exp_avg.w' holds -inf at [0]"});
  expect_fallback("nan_master", [](auto&, TrainCheckpoint& c) { set_float(c, "master.w", 3, kNaN); },
                  {"tensor 'master.w' holds nan at [3]"});
}

TEST(CheckpointValidation, NegativeSecondMomentFallsBack) {
  expect_fallback("neg_sq", [](auto&, TrainCheckpoint& c) { set_float(c, "exp_avg_sq.w", 1, -0.04f); },
                  {"tensor 'exp_avg_sq.w' holds -0.04 at element 1", ">= 0"});
}

// 8-bit AdamW: state2 (the second moment, f32 for small tensors) and the block maxima.
TEST(CheckpointValidation, EightBitStateIsCheckedToo) {
  auto eight_bit = [](TrainCheckpoint& c) {
    c.tensors.erase("exp_avg.w");
    c.tensors.erase("exp_avg_sq.w");
    c.tensors["state1.w"] = Tensor::from_floats({0.1f, 0.2f, 0.3f, 0.4f}, {4});
    c.tensors["state2.w"] = Tensor::from_floats({0.1f, 0.2f, 0.3f, 0.4f}, {4});
    c.tensors["absmax2.v"] = Tensor::from_floats({0.5f}, {1});
  };
  expect_fallback("neg_state2", [&](auto&, TrainCheckpoint& c) { eight_bit(c), set_float(c, "state2.w", 3, -1.f); },
                  {"tensor 'state2.w' holds -1 at element 3"});
  expect_fallback("nan_absmax", [&](auto&, TrainCheckpoint& c) { eight_bit(c), set_float(c, "absmax2.v", 0, kNaN); },
                  {"tensor 'absmax2.v' holds nan"});
}

TEST(CheckpointValidation, ParameterStepOutOfRangeFallsBack) {
  auto step_to = [](int64_t v) {
    return [v](auto&, TrainCheckpoint& c) { *c.tensors.at("step.w").data<int64_t>() = v; };
  };
  expect_fallback("step_neg", step_to(-5), {"tensor 'step.w'", "is -5, expected 0 to the run's step 2"});
  // A parameter cannot have been updated more often than the run stepped.
  expect_fallback("step_ahead", step_to(3), {"tensor 'step.w'", "is 3"});
}

TEST(CheckpointValidation, TamperedCountersFallBack) {
  expect_fallback("epoch", [](auto&, TrainCheckpoint& c) { c.state["epoch"] = int64_t{1000000000000000000}; },
                  {"trainer_state.json", "\"epoch\" is 1000000000000000000, beyond any real run"});
  expect_fallback("step_huge", [](auto&, TrainCheckpoint& c) { c.state["step"] = int64_t{1} << 62; },
                  {"\"step\" is 4611686018427387904"});
  expect_fallback("step_neg_state", [](auto&, TrainCheckpoint& c) { c.state["step"] = -5; },
                  {"\"step\" must be a whole number >= 0, got -5"});
  expect_fallback("cursor_text", [](auto&, TrainCheckpoint& c) { c.state["cursor"] = "3"; }, {"\"cursor\""});
  expect_fallback("world", [](auto&, TrainCheckpoint& c) { c.state["zero2_world"] = -2; }, {"\"zero2_world\""});
}

// A ZeRO-2 checkpoint: rank 1's shard is checked as well.
TEST(CheckpointValidation, ZeroTwoRankShardIsChecked) {
  expect_fallback("rank1", [](const std::string& dir, TrainCheckpoint& c) {
    c.state["zero2_world"] = 2;
    ASSERT_TRUE(save_tensors(dir + "/optimizer-rank1.safetensors",
                             {{"exp_avg_sq.w", Tensor::from_floats({0.f, kNaN}, {2})}}).ok());
  }, {"optimizer-rank1.safetensors", "tensor 'exp_avg_sq.w' holds nan at [1]"});
}

// Deleting checksums.json no longer turns verification off: the checkpoint is refused (fallback
// from an output folder), and ResumeOptions::no_verify (--no-verify) takes it as it is.
TEST(CheckpointValidation, MissingChecksumsIsRefusedUnlessNoVerify) {
  const std::string out = fresh("no_sums");
  write_pair(out, [](const std::string&, TrainCheckpoint&) {});
  fs::remove(out + "/checkpoint-2/checksums.json");
  auto r = find_resume_checkpoint(out);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dir, out + "/checkpoint-1");
  ASSERT_EQ(r->skipped.size(), 1u);
  EXPECT_NE(r->skipped[0].find("checksums.json is missing"), std::string::npos) << r->skipped[0];
  EXPECT_NE(r->skipped[0].find("--no-verify"), std::string::npos) << r->skipped[0];
  ResumeOptions unverified;
  unverified.no_verify = true;
  auto nv = find_resume_checkpoint(out, unverified);
  ASSERT_TRUE(nv.ok()) << nv.status();
  EXPECT_EQ(nv->dir, out + "/checkpoint-2");
  // no_verify skips the checksums only: damaged values are still refused.
  std::ofstream(out + "/checkpoint-2/trainer_state.json") << R"({"step": -5})";
  auto still = read_train_checkpoint(out + "/checkpoint-2", unverified);
  ASSERT_FALSE(still.ok());
  EXPECT_NE(still.status().message().find("\"step\""), std::string::npos) << still.status();
}

// Every checkpoint damaged: the error names the newest one's reason.
TEST(CheckpointValidation, NoIntactCheckpointIsAnError) {
  const std::string out = fresh("none_intact");
  write_pair(out, [](auto&, TrainCheckpoint& c) { set_float(c, "exp_avg_sq.w", 0, -1.f); });
  fs::remove(out + "/checkpoint-1/checksums.json");
  auto r = find_resume_checkpoint(out);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("no intact checkpoint in " + out), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("exp_avg_sq.w"), std::string::npos) << r.status();
}

// The writer refuses NaN state before it creates anything.
TEST(CheckpointValidation, WriterRefusesNan) {
  const std::string out = fresh("writer");
  TrainCheckpoint c = adamw_checkpoint(4);
  set_float(c, "exp_avg_sq.w", 1, kNaN);
  const absl::Status s = write_train_checkpoint(out, 4, c, [](const std::string&) { return absl::OkStatus(); });
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("refusing to write " + out + "/checkpoint-4/optimizer.safetensors"), std::string::npos) << s;
  EXPECT_NE(s.message().find("tensor 'exp_avg_sq.w' holds nan at [1]"), std::string::npos) << s;
  EXPECT_TRUE(fs::is_empty(out));
}

}  // namespace
}  // namespace loom
