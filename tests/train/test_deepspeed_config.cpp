// `--deepspeed ds_config.json` read into Loom's flags (train/deepspeed_config.h): the Hugging Face
// docs' ZeRO-2 + CPU-offload config with "auto" everywhere (tests/fixtures/deepspeed), explicit
// values, train_batch_size's arithmetic, and the refusals.
#include "train/deepspeed_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace loom {
namespace {

const std::string kTutorial = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/deepspeed/zero2_offload_auto.json";

std::string write(const std::string& text) {
  const std::string p = ::testing::TempDir() + "ds_" + std::to_string(getpid()) + ".json";
  std::ofstream(p) << text;
  return p;
}

bool has(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }
bool mentions(const std::vector<std::string>& notes, const std::string& s) {
  return std::any_of(notes.begin(), notes.end(), [&](const std::string& n) { return n.find(s) != std::string::npos; });
}

TEST(DeepSpeedConfig, TheTutorialsZero2OffloadConfigWithAutoEverywhere) {
  auto one = read_deepspeed_config(kTutorial, 1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->flags, (std::vector<std::string>{"--offload-optimizer", "--schedule=constant"}));
  EXPECT_TRUE(mentions(one->notes, "stage 2: one process")) << one->notes.size();
  EXPECT_TRUE(mentions(one->notes, "not used by Loom: steps_per_print, wall_clock_breakdown"));
  EXPECT_TRUE(mentions(one->notes, "reduce_bucket_size"));
  auto two = read_deepspeed_config(kTutorial, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_TRUE(has(two->flags, "--dist=zero2"));
  EXPECT_TRUE(has(two->flags, "--offload-optimizer"));
}

TEST(DeepSpeedConfig, ExplicitValuesBecomeLoomsFlags) {
  auto t = read_deepspeed_config(write(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
      "train_batch_size": 16, "gradient_clipping": 0.5, "bf16": {"enabled": true}, "zero_optimization": {"stage": 1},
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "weight_decay": 0.01, "betas": [0.9, 0.95]}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 100, "total_num_steps": 1000}}})"), 2);
  ASSERT_TRUE(t.ok()) << t.status();
  for (const char* f : {"--dist=zero2", "--batch-size=4", "--grad-accum=2", "--max-grad-norm=0.5", "--dtype=bf16",
                        "--lr=3e-05", "--weight-decay=0.01", "--schedule=linear", "--warmup=100"})
    EXPECT_TRUE(has(t->flags, f)) << f;
  EXPECT_TRUE(mentions(t->notes, "stage 1 runs as Loom's zero2"));
  EXPECT_TRUE(mentions(t->notes, "betas [0.9,0.95]"));
  // train_batch_size fills the one of micro-batch and accumulation left to "auto".
  auto filled = read_deepspeed_config(write(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
      "gradient_accumulation_steps": "auto"})"), 2);
  ASSERT_TRUE(filled.ok()) << filled.status();
  EXPECT_TRUE(has(filled->flags, "--grad-accum=4"));
  auto fp16 = read_deepspeed_config(write(R"({"fp16": {"enabled": true}})"), 1);
  ASSERT_TRUE(fp16.ok());
  EXPECT_TRUE(has(fp16->flags, "--dtype=bf16"));
  EXPECT_TRUE(mentions(fp16->notes, "no loss scaling"));
}

TEST(DeepSpeedConfig, WhatLoomCannotDoIsRefusedByName) {
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {R"({"zero_optimization": {"stage": 3}})", "ZeRO-3 shards the parameters"},
           {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})", "not to NVMe"},
           {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})", "ZeRO-3"},
           {R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})",
            "\"train_batch_size\": 30 is not train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x 2 ranks (16)"},
           {R"({"gradient_accumulation_steps": 1.5})", "expected a positive integer"},
           {R"({"optimizer": {"type": "Lamb"}})", "Loom trains with AdamW"},
           {R"({"scheduler": {"type": "OneCycle"}})", "Loom has WarmupLR"},
           {R"({"bf16": {"enabled": "yes"}})", "expected true, false or \"auto\""},
           {R"([1, 2])", "a DeepSpeed config is a JSON object"}}) {
    auto t = read_deepspeed_config(write(text), 2);
    ASSERT_FALSE(t.ok()) << text;
    EXPECT_NE(std::string(t.status().message()).find(says), std::string::npos) << t.status();
  }
  EXPECT_FALSE(read_deepspeed_config("/no/such/ds_config.json", 1).ok());
}

}  // namespace
}  // namespace loom
