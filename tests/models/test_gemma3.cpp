// Gemma 3 text (models/families/gemma3.cpp): config.json in the 4.x form google/gemma-3-1b-it
// publishes and in the 5.x per-layer-type rope_parameters form, checked against transformers'
// rules (Gemma3TextConfig defaults; layer i slides unless (i + 1) % sliding_window_pattern == 0; the
// local RoPE base unscaled), and the model against transformers + PEFT on the tiny fixture that
// tools/reference/make_reference.py makes (skipped until that fixture is committed).
#include <gtest/gtest.h>

#include <filesystem>

#include <fstream>

#include "engine/json_file.h"
#include "models/config.h"
#include "models/family.h"
#include "tests/models/family_checks.h"
#include "tests/temp_dir.h"

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

// google/gemma-3-4b-it's config.json (transformers 4.50): the language model's keys under text_config,
// which leaves the sizes it shares with Gemma3TextConfig's defaults out (vocab_size 262208).
const char* kGemma3_4b = R"({
  "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
  "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
  "model_type": "gemma3",
  "text_config": {"head_dim": 256, "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                  "num_attention_heads": 8, "num_hidden_layers": 34, "num_key_value_heads": 4,
                  "query_pre_attn_scalar": 256, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                  "sliding_window": 1024},
  "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
  "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                    "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                    "patch_size": 14, "vision_use_head": false}})";

TEST(Gemma3Config, MultimodalFolderReadsItsTextConfig) {
  const ModelConfig c = parse_ok(kGemma3_4b);
  ASSERT_NE(c.family, nullptr);
  EXPECT_EQ(c.family->name, "gemma3");
  EXPECT_EQ(c.model_type, "gemma3");
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_EQ(c.hidden_size, 2560);
  EXPECT_EQ(c.num_hidden_layers, 34);
  EXPECT_EQ(c.num_key_value_heads, 4);
  std::vector<bool> sliding(34, true);
  for (int i : {5, 11, 17, 23, 29}) sliding[i] = false;
  EXPECT_EQ(c.layer_is_sliding, sliding);
  EXPECT_EQ(c.sliding_window, 1024);
  EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::kLinear);
  EXPECT_EQ(c.rope.scaling.factor, 8.0);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope_sliding.scaling.kind, RopeScaling::Kind::kDefault);
  EXPECT_EQ(c.rope_sliding.theta, 1e4);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 106}));  // from the top level
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_TRUE(c.tie_word_embeddings);
  auto bad = ModelConfig::from_json_text(R"({"model_type": "gemma3", "text_config": [1]})", "config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("text_config"), std::string::npos) << bad.status();
}

const char* kTinyText = R"({"model_type": "gemma3_text", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
  "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "sliding_window": 3,
  "layer_types": ["sliding_attention", "full_attention"], "rope_local_base_freq": 100.0})";

// A multimodal folder holding a language model with known weights (a random gemma3_text model's,
// under the 4.x or 5.x prefix) beside vision tensors: Loom must read exactly that language model.
void check_multimodal_layout(const std::string& prefix, const std::string& vision) {
  auto text = ModelConfig::from_json_text(kTinyText, "config.json");
  ASSERT_TRUE(text.ok()) << text.status();
  auto ref = CausalLM::init_random(*text, {DType::f32, Device::cpu()}, 11);
  ASSERT_TRUE(ref.ok()) << ref.status();
  TempDir dir("loom_gemma3_mm");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, v] : (*ref)->named_weights()) tensors.emplace_back(prefix + name.substr(6), v->value());
  tensors.emplace_back(vision + "vision_tower.vision_model.embeddings.patch_embedding.weight", Tensor::zeros({4, 3}, DType::f32, Device::cpu()));
  tensors.emplace_back(vision + "multi_modal_projector.mm_input_projection_weight", Tensor::zeros({4, 32}, DType::f32, Device::cpu()));
  ASSERT_TRUE(save_tensors(dir.path() + "/model.safetensors", tensors).ok());
  nlohmann::json config = {{"model_type", "gemma3"}, {"architectures", {"Gemma3ForConditionalGeneration"}},
                           {"text_config", nlohmann::json::parse(kTinyText)}, {"eos_token_id", {1, 106}},
                           {"vision_config", {{"model_type", "siglip_vision_model"}}}};
  std::ofstream(dir.path() + "/config.json") << config.dump();

  auto mm = CausalLM::load(dir.path(), {DType::f32, Device::cpu()});
  ASSERT_TRUE(mm.ok()) << mm.status();
  ASSERT_EQ((*mm)->load_notes().size(), 1u);
  EXPECT_NE((*mm)->load_notes()[0].find("left out 2 tensors"), std::string::npos) << (*mm)->load_notes()[0];
  const Tensor ids = Tensor::from_ints({3, 7, 1, 60, 22, 9, 41, 5}, {1, 8});
  {
    ag::NoGradGuard ng;
    EXPECT_EQ(rel_err((*mm)->forward(ids).value(), (*ref)->forward(ids).value()), 0.0) << prefix;
  }
  // Saved as the language model alone, which Loom (and transformers' Gemma3ForCausalLM) reads back.
  TempDir out("loom_gemma3_mm_out");
  ASSERT_TRUE(save_pretrained(**mm, out.path()).ok());
  auto saved = read_json_file(out.path() + "/config.json");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ((*saved)["model_type"], "gemma3_text");
  EXPECT_EQ((*saved)["architectures"][0], "Gemma3ForCausalLM");
  EXPECT_EQ((*saved)["eos_token_id"], nlohmann::json({1, 106}));
  EXPECT_TRUE(read_all(out.path() + "/model.safetensors").count("model.layers.1.self_attn.k_norm.weight"));
  auto again = CausalLM::load(out.path(), {DType::f32, Device::cpu()});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->config().model_type, "gemma3_text");
}

TEST(Gemma3Model, MultimodalCheckpointReadsTheLanguageModel) {
  check_multimodal_layout("language_model.model.", "");  // transformers 4.x files
  check_multimodal_layout("model.language_model.", "model.");  // transformers 5.x
}

// The tiny fixture: transformers + PEFT on the CPU in f32 (test_families.cpp's bounds).
constexpr Tolerances kF32{2e-5, 1e-5, 1e-4, 1e-4};
constexpr const char* kVariant = "gemma3";

bool have_fixture() { return std::filesystem::exists(fixture_dir(kVariant) + "/reference_lora.safetensors"); }
#define REQUIRE_GEMMA3_FIXTURE()                                                                            \
  if (!have_fixture())                                                                                      \
  GTEST_SKIP() << "no " << fixture_dir(kVariant) << ": run `python3 tools/reference/make_reference.py --only gemma3` " \
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
