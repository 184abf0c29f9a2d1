// Gemma 3 text (models/families/gemma3.cpp): config.json in the 4.x form google/gemma-3-1b-it
// publishes and in the 5.x per-layer-type rope_parameters form, checked against transformers'
// rules (Gemma3TextConfig defaults; layer i slides unless (i + 1) % sliding_window_pattern == 0; the
// local RoPE base unscaled), and the model against transformers + PEFT on the tiny fixture that
// tools/make_reference.py makes (skipped until that fixture is committed).
#include <gtest/gtest.h>

#include <filesystem>

#include "models/config.h"
#include "models/family.h"
#include "tests/models/family_checks.h"

namespace loom::test {
namespace {

// google/gemma-3-1b-it's config.json (transformers 4.50).
const char* kGemma3_1b = R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106],
  "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
  "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
  "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
  "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
  "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144})";

// A 4B-shaped text config as transformers 5 writes it: layer_types and rope_parameters per layer type,
// the global RoPE linearly scaled by 8.
const char* kGemma3v5 = R"({
  "architectures": ["Gemma3ForCausalLM"], "head_dim": 256, "hidden_size": 2560, "intermediate_size": 10240,
  "model_type": "gemma3_text", "num_attention_heads": 8, "num_hidden_layers": 4, "num_key_value_heads": 4,
  "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
  "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
  "sliding_window": 1024, "vocab_size": 262208, "dtype": "bfloat16"})";

ModelConfig parse_ok(const char* text) {
  auto c = ModelConfig::from_json_text(text, "config.json");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig{};
}

TEST(Gemma3Config, TransformersV4FileWithPatternAndLocalBase) {
  const ModelConfig c = parse_ok(kGemma3_1b);
  ASSERT_NE(c.family, nullptr);
  EXPECT_EQ(c.family->name, "gemma3_text");
  std::vector<bool> sliding(26, true);
  for (int i : {5, 11, 17, 23}) sliding[i] = false;
  EXPECT_EQ(c.layer_is_sliding, sliding);
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::kDefault);
  EXPECT_EQ(c.rope_sliding.theta, 1e4);
  EXPECT_EQ(c.rope_sliding.scaling.kind, RopeScaling::Kind::kDefault);
  EXPECT_EQ(&c.rope_for_layer(5), &c.rope);
  EXPECT_EQ(&c.rope_for_layer(4), &c.rope_sliding);
  EXPECT_EQ(c.attn_logit_softcapping, 0.f);
  EXPECT_EQ(c.final_logit_softcapping, 0.f);
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.f / 16);
  EXPECT_EQ(c.hidden_act, "gelu_pytorch_tanh");
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 106}));
  EXPECT_TRUE(c.family->has_layer_module("self_attn.q_norm"));
  EXPECT_TRUE(c.family->has_layer_module("pre_feedforward_layernorm"));
  EXPECT_TRUE(c.family->norm_adds_one && c.family->embed_scale);
}

TEST(Gemma3Config, TransformersV5RopeParametersPerLayerType) {
  const ModelConfig c = parse_ok(kGemma3v5);
  EXPECT_EQ(c.layer_is_sliding, (std::vector<bool>{true, true, false, true}));
  EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::kLinear);
  EXPECT_EQ(c.rope.scaling.factor, 8.0);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope_sliding.scaling.kind, RopeScaling::Kind::kDefault);
  EXPECT_EQ(c.rope_sliding.theta, 1e4);
  // Gemma3TextConfig's defaults for what the file leaves out.
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.query_pre_attn_scalar, 256);
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1}));
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_NE(c.summary().find("sliding layers' rope default theta 10000"), std::string::npos) << c.summary();
}

TEST(Gemma3Config, DefaultsWithoutRopeKeys) {
  const ModelConfig c = parse_ok(R"({"model_type": "gemma3_text", "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 7, "num_attention_heads": 2})");
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope_sliding.theta, 1e4);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.layer_is_sliding, (std::vector<bool>{true, true, true, true, true, false, true}));
}

TEST(Gemma3Config, PerLayerTypeRopeNeedsBothTypes) {
  auto c = ModelConfig::from_json_text(R"({"model_type": "gemma3_text", "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 2,
    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}})",
                                       "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("sliding_attention"), std::string::npos) << c.status();
}

// The tiny fixture: transformers + PEFT on the CPU in f32 (test_families.cpp's bounds).
constexpr Tolerances kF32{2e-5, 1e-5, 1e-4, 1e-4};
constexpr const char* kVariant = "gemma3";

bool have_fixture() { return std::filesystem::exists(fixture_dir(kVariant) + "/reference_lora.safetensors"); }
#define REQUIRE_GEMMA3_FIXTURE()                                                                            \
  if (!have_fixture())                                                                                      \
  GTEST_SKIP() << "no " << fixture_dir(kVariant) << ": run `python3 tools/make_reference.py --only gemma3` " \
               << "on the GPU machine (torch, transformers, peft) and commit its output"

TEST(Gemma3Model, BaseLogitsAndLossMatchTransformers) {
  REQUIRE_GEMMA3_FIXTURE();
  check_base_logits(kVariant, {DType::f32, Device::cpu()}, kF32);
}

TEST(Gemma3Model, LoraLogitsGradientsAndStepMatchPeft) {
  REQUIRE_GEMMA3_FIXTURE();
  check_lora(kVariant, {DType::f32, Device::cpu()}, kF32);
}

TEST(Gemma3Model, LoraBf16WithinTorchsBf16Error) {
  REQUIRE_GEMMA3_FIXTURE();
  check_lora(kVariant, {DType::bf16, Device::cpu()}, Tolerances{0, 0, 0, 0, true});
}

TEST(Gemma3Model, MergedAdapterMatchesPeftMerge) {
  REQUIRE_GEMMA3_FIXTURE();
  check_merged(kVariant, {DType::f32, Device::cpu()}, kF32);
}

TEST(Gemma3Model, FusedLossAndGradientsMatchPeft) {
  REQUIRE_GEMMA3_FIXTURE();
  check_fused_loss(kVariant, {DType::f32, Device::cpu()}, kF32);
}

}  // namespace
}  // namespace loom::test
