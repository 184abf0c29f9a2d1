// --checkpointing auto and loom doctor's estimate: within 10 % of the peaks measured on an H200
// (bench/results/session30), and the choice is the fastest mode that fits.
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "train/checkpointing_plan.h"
#include "train/device_plan.h"

namespace loom {
namespace {

constexpr int64_t kGiB = 1LL << 30;

ModelConfig llama(int64_t hidden, int64_t intermediate, int64_t layers) {
  ModelConfig c;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.vocab_size = 128256;
  return c;
}

// What the choice allows for a need: the margin of choose_checkpointing (10 % + 512 MiB).
double allowed(int64_t need) { return need * 1.1 + 512.0 * (1 << 20); }

// The peak of a training step, as `loom doctor --model` and `loom train`'s start summary estimate it
// (the planner's weights and trainable state, plus the checkpointing mode's need), within 10 % of the
// peaks `loom train` measured on an H200 (Loom's allocator; bench/e2e/memory_check.sh, table in
// bench/results/session30/memory_check_before.md): the 1B shape at 8 x 2048 tokens, the 8B at 4 x 2048,
// LoRA r16 on every projection and QLoRA, bf16, every mode.
TEST(CheckpointingPlan, PeakWithinTenPercentOfTheMeasuredPeaks) {
  auto config = [](int64_t hidden, int64_t inter, int64_t layers, bool tied) {
    nlohmann::json j = {{"model_type", "llama"}, {"vocab_size", 128256}, {"hidden_size", hidden},
                        {"intermediate_size", inter}, {"num_hidden_layers", layers}, {"num_attention_heads", 32},
                        {"num_key_value_heads", 8}, {"tie_word_embeddings", tied}};
    auto c = ModelConfig::from_json_text(j.dump(), "config.json");
    EXPECT_TRUE(c.ok()) << c.status();
    return *c;
  };
  const ModelConfig b1 = config(2048, 8192, 16, true), b8 = config(4096, 14336, 32, false);
  struct Case {
    const ModelConfig* c;
    int64_t tokens;
    bool qlora;
    Checkpointing mode;
    double measured_gib;
  } cases[] = {
      {&b1, 8 * 2048, false, Checkpointing::kNone, 17.747},     {&b1, 8 * 2048, false, Checkpointing::kRecompute, 4.664},
      {&b1, 8 * 2048, false, Checkpointing::kOffload, 3.825},   {&b1, 8 * 2048, true, Checkpointing::kNone, 16.402},
      {&b1, 8 * 2048, true, Checkpointing::kRecompute, 3.349},  {&b1, 8 * 2048, true, Checkpointing::kOffload, 2.511},
      {&b8, 4 * 2048, false, Checkpointing::kNone, 43.417},     {&b8, 4 * 2048, false, Checkpointing::kRecompute, 18.567},
      {&b8, 4 * 2048, false, Checkpointing::kOffload, 16.915},  {&b8, 4 * 2048, true, Checkpointing::kNone, 33.77},
      {&b8, 4 * 2048, true, Checkpointing::kRecompute, 9.028},  {&b8, 4 * 2048, true, Checkpointing::kOffload, 7.299},
  };
  for (const Case& k : cases) {
    PlanOptions o;
    o.qlora = k.qlora, o.tokens = k.tokens, o.checkpointing = k.mode;
    int64_t fixed = 0;
    for (const PlanUnit& u : plan_units(*k.c, o)) fixed += u.weight_bytes + u.state_bytes;
    const CheckpointingNeeds n = estimate_checkpointing_needs(*k.c, k.tokens, DType::bf16, fixed);
    const int64_t need = k.mode == Checkpointing::kNone ? n.none : k.mode == Checkpointing::kRecompute ? n.recompute : n.offload;
    const double est = static_cast<double>(need) / kGiB;
    EXPECT_NEAR(est, k.measured_gib, 0.1 * k.measured_gib)
        << k.c->num_hidden_layers << " layers, " << (k.qlora ? "QLoRA " : "LoRA ") << checkpointing_name(k.mode);
  }
}

TEST(CheckpointingPlan, PicksTheFastestModeThatFits) {
  const CheckpointingNeeds n = estimate_checkpointing_needs(llama(2048, 8192, 16), 8 * 2048, DType::bf16, kGiB);
  EXPECT_GT(n.none, n.recompute);
  EXPECT_GT(n.recompute, n.offload);
  CheckpointingChoice c = choose_checkpointing(n, 120 * kGiB, "cuda:0");
  EXPECT_EQ(c.mode, Checkpointing::kNone) << c.reason;
  c = choose_checkpointing(n, 8 * kGiB, "cuda:0");
  EXPECT_EQ(c.mode, Checkpointing::kRecompute) << c.reason;
  EXPECT_NE(c.reason.find("recompute"), std::string::npos);
  EXPECT_NE(c.reason.find("8.0 GiB available on cuda:0"), std::string::npos) << c.reason;
  const int64_t between = static_cast<int64_t>(allowed(n.offload)) + (64 << 20);
  ASSERT_LT(between, allowed(n.recompute));
  c = choose_checkpointing(n, between, "cuda:0");
  EXPECT_EQ(c.mode, Checkpointing::kOffload) << c.reason;
  c = choose_checkpointing(n, kGiB / 2, "cuda:0");
  EXPECT_EQ(c.mode, Checkpointing::kOffload);
  EXPECT_NE(c.reason.find("smaller --batch-size"), std::string::npos) << c.reason;
}

// Out of memory in `loom train`: the advice names the leaner settings this run has not used yet,
// with the values it runs with, and nothing it already uses.
bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(OutOfMemoryAdvice, NoCheckpointingSuggestsBothModesAndTheShape) {
  TrainConfig c;
  c.dtype = DType::bf16;
  c.batch_size = 8;
  c.seq_len = 2048;
  const std::string a = out_of_memory_advice(c, Checkpointing::kNone, 3);
  EXPECT_EQ(a.rfind("Training step 3 (8 x 2048 tokens a micro-batch, --checkpointing none): try ", 0), 0u) << a;
  for (const char* part : {"--checkpointing recompute", "--checkpointing offload", "--batch-size (now 8)",
                           "--grad-accum (now 1)", "--seq-len (now 2048)", "--qlora"})
    EXPECT_TRUE(has(a, part)) << part << " missing from: " << a;
  EXPECT_FALSE(has(a, "--dtype")) << a;  // already bf16
}

TEST(OutOfMemoryAdvice, LeanestLoRARunIsOnlyToldToShortenTheSequence) {
  TrainConfig c;
  c.dtype = DType::bf16;
  c.qlora = true;
  c.batch_size = 1;
  c.seq_len = 524288;
  const std::string a = out_of_memory_advice(c, Checkpointing::kOffload, 1);
  EXPECT_TRUE(has(a, "try a shorter --seq-len (now 524288).")) << a;
  for (const char* part : {"--checkpointing recompute", "--checkpointing offload (", "--batch-size", "--qlora ("})
    EXPECT_FALSE(has(a, part)) << part << " in: " << a;
}

TEST(OutOfMemoryAdvice, RecomputeSuggestsOffloadOnly) {
  TrainConfig c;
  const std::string a = out_of_memory_advice(c, Checkpointing::kRecompute, 1);
  const std::string tries = a.substr(a.find(": try ") + 2);  // after "(..., --checkpointing recompute)"
  EXPECT_EQ(tries.rfind("try --checkpointing offload (", 0), 0u) << a;
  EXPECT_FALSE(has(tries, "--checkpointing recompute")) << a;
}

TEST(OutOfMemoryAdvice, WhileSettingUpNamesTheWeightsNotTheStep) {
  TrainConfig c;
  c.full = true;
  c.dtype = DType::f32;
  const std::string a = out_of_memory_advice(c, std::nullopt, 0);
  EXPECT_EQ(a.rfind("Setting up the run (the model, LoRA, the optimizer): try ", 0), 0u) << a;
  for (const char* part : {"--dtype bf16", "--optim adamw8bit", "--offload-optimizer"})
    EXPECT_TRUE(has(a, part)) << part << " missing from: " << a;
  for (const char* part : {"--seq-len", "--checkpointing", "--qlora"}) EXPECT_FALSE(has(a, part)) << part << " in: " << a;
  c.dtype = DType::bf16;
  c.optim = "adamw8bit";
  c.offload_optimizer = true;
  EXPECT_EQ(out_of_memory_advice(c, std::nullopt, 0),
            "Setting up the run (the model, LoRA, the optimizer): nothing leaner is left to try on this device.");
}

}  // namespace
}  // namespace loom
