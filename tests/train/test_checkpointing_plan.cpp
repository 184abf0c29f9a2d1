// --checkpointing auto: the estimate of what each mode keeps covers the peaks measured on an H200
// (bench/results/2026-12-02-h200-session17.md), and the choice is the fastest mode that fits.
#include <gtest/gtest.h>

#include "train/checkpointing_plan.h"

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

TEST(CheckpointingPlan, EstimatesCoverTheMeasuredPeaks) {
  // Peak GPU memory of `loom train` (LoRA r16, bf16, 2048-token rows) minus the bf16 weights; the
  // estimate's fixed part is the fused loss's workspace (at most 1 GiB) and LoRA's small state.
  struct Case {
    const char* what;
    ModelConfig c;
    int64_t tokens;
    double weights_gib;
    Checkpointing mode;
    double peak_gib;
  } cases[] = {
      {"1B none", llama(2048, 8192, 16), 8 * 2048, 2.30, Checkpointing::kNone, 17.87},
      {"1B recompute", llama(2048, 8192, 16), 8 * 2048, 2.30, Checkpointing::kRecompute, 5.16},
      {"1B offload", llama(2048, 8192, 16), 8 * 2048, 2.30, Checkpointing::kOffload, 4.32},
      {"8B recompute", llama(4096, 14336, 32), 4 * 2048, 14.96, Checkpointing::kRecompute, 19.0},
      {"8B offload", llama(4096, 14336, 32), 4 * 2048, 14.96, Checkpointing::kOffload, 17.27},
  };
  for (const Case& k : cases) {
    const CheckpointingNeeds n = estimate_checkpointing_needs(k.c, k.tokens, DType::bf16, kGiB);
    const int64_t need = k.mode == Checkpointing::kNone ? n.none : k.mode == Checkpointing::kRecompute ? n.recompute : n.offload;
    EXPECT_GE(allowed(need), (k.peak_gib - k.weights_gib) * kGiB) << k.what << ": estimate " << need / double(kGiB) << " GiB";
    // Not so loose that it would push a run that fits into a slower mode: within 2x of the measurement.
    EXPECT_LE(need, 2 * (k.peak_gib - k.weights_gib) * kGiB) << k.what;
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
