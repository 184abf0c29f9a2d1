// ModelConfig tests: real config.json files of each family written out by hand (transformers 4.x and
// 5.x spellings), the transformers defaults for absent keys, and one test per error class with the
// message checked to name the file and the field.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "models/config.h"
#include "models/rope_scaling.h"
#include "models/family.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

using nlohmann::json;
constexpr const char* kOrigin = "/models/test/config.json";

// meta-llama/Llama-3.1-8B, as published (transformers 4.43).
const char* kLlama31 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

// The same model as transformers 5 writes it: rope_parameters, "dtype".
const char* kLlama31v5 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
  "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
  "tie_word_embeddings": false, "dtype": "bfloat16", "transformers_version": "5.0.0", "vocab_size": 128256})";

// Qwen/Qwen2.5-7B-Instruct.
const char* kQwen25 = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 18944, "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "qwen2",
  "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false, "vocab_size": 152064})";

// Qwen/Qwen3-4B: head_dim 128 although hidden_size / heads = 80.
const char* kQwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
  "initializer_range": 0.02, "intermediate_size": 9728, "max_position_embeddings": 40960,
  "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

// google/gemma-7b as first published: "hidden_act": "gelu", no hidden_activation.
const char* kGemma7b = R"({
  "architectures": ["GemmaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 2,
  "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu", "hidden_size": 3072, "initializer_range": 0.02,
  "intermediate_size": 24576, "max_position_embeddings": 8192, "model_type": "gemma", "num_attention_heads": 16,
  "num_hidden_layers": 28, "num_key_value_heads": 16, "pad_token_id": 0, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 10000.0, "torch_dtype": "bfloat16", "vocab_size": 256000})";

// google/gemma-2-27b: query_pre_attn_scalar 144 = hidden / heads, head_dim 128.
const char* kGemma2 = R"({
  "architectures": ["Gemma2ForCausalLM"], "attn_logit_softcapping": 50.0, "bos_token_id": 2,
  "cache_implementation": "hybrid", "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 128,
  "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 4608,
  "intermediate_size": 36864, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 32,
  "num_hidden_layers": 46, "num_key_value_heads": 16, "pad_token_id": 0, "query_pre_attn_scalar": 144,
  "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "bfloat16",
  "vocab_size": 256000})";

// mistralai/Mistral-7B-v0.1.
const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
  "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "vocab_size": 32000})";

// Only the keys Loom requires.
json minimal(const std::string& type) {
  return json{{"model_type", type},       {"vocab_size", 1000},     {"hidden_size", 64},
              {"intermediate_size", 128}, {"num_hidden_layers", 4}, {"num_attention_heads", 4}};
}

absl::StatusOr<ModelConfig> parse(const json& j) { return ModelConfig::from_json_text(j.dump(), kOrigin); }
ModelConfig parse_ok(const json& j) {
  auto c = parse(j);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig{};
}

// Parsing fails with InvalidArgument and a message holding the file name and every part.
void expect_error(const json& j, const std::vector<std::string>& parts) {
  auto c = parse(j);
  ASSERT_FALSE(c.ok()) << "parsed although it should not: " << j.dump();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  const std::string msg(c.status().message());
  EXPECT_NE(msg.find(kOrigin), std::string::npos) << msg;
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

std::vector<bool> alternating(int n, bool first) {
  std::vector<bool> v(n);
  for (int i = 0; i < n; ++i) v[i] = (i % 2 == 0) == first;
  return v;
}

// ---- each family --------------------------------------------------------------------------------

void expect_llama31(const ModelConfig& c) {
  EXPECT_EQ(c.family->name, "llama");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 4096);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope.scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope.scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.scaling.high_freq_factor, 4.0);
  EXPECT_DOUBLE_EQ(c.rope.scaling.original_max_position_embeddings, 8192.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.layer_is_sliding, std::vector<bool>(32, false));
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_id, 128001);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_FALSE(c.pad_token_id.has_value());
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / std::sqrt(128.0f));
  EXPECT_EQ(c.attn_logit_softcapping, 0.0f);
  EXPECT_EQ(c.final_logit_softcapping, 0.0f);
}

TEST(ModelConfig, Llama31TransformersV4) { expect_llama31(parse_ok(json::parse(kLlama31))); }
TEST(ModelConfig, Llama31TransformersV5RopeParameters) { expect_llama31(parse_ok(json::parse(kLlama31v5))); }

TEST(ModelConfig, RopeParametersWinOverTopLevelRopeTheta) {
  json j = json::parse(kLlama31v5);
  j["rope_theta"] = 10000.0;  // a stale 4.x key beside the 5.x dict
  EXPECT_DOUBLE_EQ(parse_ok(j).rope.theta, 500000.0);
  j["rope_parameters"].erase("rope_theta");  // the dict without a theta: fall back on the top-level key
  EXPECT_DOUBLE_EQ(parse_ok(j).rope.theta, 10000.0);
}

TEST(ModelConfig, LlamaDefaultsMatchTransformers) {
  const ModelConfig c = parse_ok(minimal("llama"));
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::kDefault);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_FALSE(c.pad_token_id.has_value());
  EXPECT_EQ(c.torch_dtype, "");
  EXPECT_FALSE(c.summary().empty());
}

TEST(ModelConfig, LlamaBiasesAndExplicitHeadDim) {
  json j = minimal("llama");
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  j["head_dim"] = 32;  // explicit: q_dim 128 != hidden 64
  j["num_key_value_heads"] = 2;
  j["eos_token_id"] = nullptr;
  j["bos_token_id"] = nullptr;
  const ModelConfig c = parse_ok(j);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.o_proj_bias);
  EXPECT_TRUE(c.mlp_bias);
  EXPECT_EQ(c.q_dim(), 128);
  EXPECT_EQ(c.kv_dim(), 64);
  EXPECT_FALSE(c.eos_token_id.has_value());
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_FALSE(c.bos_token_id.has_value());
}

TEST(ModelConfig, LinearRopeWithLegacyTypeKey) {
  json j = minimal("llama");
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  const ModelConfig c = parse_ok(j);
  EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::kLinear);
  EXPECT_DOUBLE_EQ(c.rope.scaling.factor, 2.0);
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(parse_ok(j).rope.scaling.kind, RopeScaling::Kind::kDefault);
  j["rope_scaling"] = nullptr;
  EXPECT_EQ(parse_ok(j).rope.scaling.kind, RopeScaling::Kind::kDefault);
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 1e6}};
  const ModelConfig c5 = parse_ok(j);
  EXPECT_EQ(c5.rope.scaling.kind, RopeScaling::Kind::kLinear);
  EXPECT_DOUBLE_EQ(c5.rope.scaling.factor, 4.0);
  EXPECT_DOUBLE_EQ(c5.rope.theta, 1e6);
}

TEST(ModelConfig, MistralSlidingWindow) {
  const ModelConfig c = parse_ok(json::parse(kMistral));
  EXPECT_EQ(c.family->name, "mistral");
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.layer_is_sliding, std::vector<bool>(32, true));
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_FALSE(c.attention_bias);

  json j = json::parse(kMistral);
  j["sliding_window"] = nullptr;  // Mistral v0.2+
  const ModelConfig none = parse_ok(j);
  EXPECT_EQ(none.sliding_window, 0);
  EXPECT_EQ(none.layer_is_sliding, std::vector<bool>(32, false));

  const ModelConfig d = parse_ok(minimal("mistral"));  // transformers' MistralConfig defaults
  EXPECT_EQ(d.sliding_window, 4096);
  EXPECT_EQ(d.num_key_value_heads, 4);  // = num_attention_heads when absent
  EXPECT_EQ(d.max_position_embeddings, 131072);
}

TEST(ModelConfig, Qwen25HasQkvBiasAndIgnoresDisabledSlidingWindow) {
  const ModelConfig c = parse_ok(json::parse(kQwen25));
  EXPECT_EQ(c.family->name, "qwen2");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.layer_is_sliding, std::vector<bool>(28, false));
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_id, 151645);
  EXPECT_FALSE(c.tie_word_embeddings);

  // transformers 5 form: rope_parameters and an explicit all-full layer_types.
  json j = json::parse(kQwen25);
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  j["layer_types"] = std::vector<std::string>(28, "full_attention");
  const ModelConfig c5 = parse_ok(j);
  EXPECT_DOUBLE_EQ(c5.rope.theta, 1e6);
  EXPECT_EQ(c5.layer_is_sliding, std::vector<bool>(28, false));

  const ModelConfig d = parse_ok(minimal("qwen2"));
  EXPECT_FALSE(d.bos_token_id.has_value());
  EXPECT_FALSE(d.eos_token_id.has_value());
  EXPECT_EQ(d.max_position_embeddings, 32768);
}

TEST(ModelConfig, Qwen3ExplicitAndDefaultHeadDim) {
  const ModelConfig c = parse_ok(json::parse(kQwen3));
  EXPECT_EQ(c.family->name, "qwen3");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 4096);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / std::sqrt(128.0f));

  json j = json::parse(kQwen3);
  j.erase("head_dim");  // Qwen3Config's default is 128, not hidden / heads (= 80)
  EXPECT_EQ(parse_ok(j).head_dim, 128);
  j["attention_bias"] = true;
  EXPECT_TRUE(parse_ok(j).attention_bias);
  EXPECT_TRUE(parse_ok(j).o_proj_bias);
}

TEST(ModelConfig, GemmaLegacyGeluIsTheTanhApproximation) {
  const ModelConfig c = parse_ok(json::parse(kGemma7b));
  EXPECT_EQ(c.family->name, "gemma");
  EXPECT_EQ(c.hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.q_dim(), 4096);
  EXPECT_TRUE(c.tie_word_embeddings);  // GemmaConfig default
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.query_pre_attn_scalar, 0.0);
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / 16.0f);

  json j = json::parse(kGemma7b);
  j["hidden_activation"] = "gelu_pytorch_tanh";  // gemma 1.1 files carry both keys
  EXPECT_EQ(parse_ok(j).hidden_act, "gelu_pytorch_tanh");
  j["hidden_activation"] = "gelu";  // asked for exact GELU explicitly: not implemented
  expect_error(j, {"hidden_activation", "gelu", "silu, gelu_pytorch_tanh"});

  const ModelConfig d = parse_ok(minimal("gemma"));
  EXPECT_EQ(d.head_dim, 256);
  EXPECT_EQ(d.num_key_value_heads, 4);
  EXPECT_EQ(d.hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(d.max_position_embeddings, 8192);
}

TEST(ModelConfig, Gemma2DefaultAlternationSoftcapsAndScale) {
  const ModelConfig c = parse_ok(json::parse(kGemma2));
  EXPECT_EQ(c.family->name, "gemma2");
  EXPECT_EQ(c.hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.layer_is_sliding, alternating(46, /*first=*/true));  // even layers slide
  EXPECT_FLOAT_EQ(c.attn_logit_softcapping, 50.0f);
  EXPECT_FLOAT_EQ(c.final_logit_softcapping, 30.0f);
  EXPECT_DOUBLE_EQ(c.query_pre_attn_scalar, 144.0);
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / 12.0f);  // 144^-0.5, not head_dim^-0.5
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(ModelConfig, Gemma2LayerTypesNullCapsAndDefaults) {
  json j = json::parse(kGemma2);
  j["num_hidden_layers"] = 5;
  j["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention", "full_attention",
                      "sliding_attention"};
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
  j.erase("torch_dtype");
  j["dtype"] = "float32";
  const ModelConfig c = parse_ok(j);
  EXPECT_EQ(c.layer_is_sliding, (std::vector<bool>{false, true, true, false, true}));
  EXPECT_EQ(c.attn_logit_softcapping, 0.0f);
  EXPECT_EQ(c.final_logit_softcapping, 0.0f);
  EXPECT_EQ(c.torch_dtype, "float32");

  const ModelConfig d = parse_ok(minimal("gemma2"));  // Gemma2Config defaults
  EXPECT_FLOAT_EQ(d.attn_logit_softcapping, 50.0f);
  EXPECT_FLOAT_EQ(d.final_logit_softcapping, 30.0f);
  EXPECT_DOUBLE_EQ(d.query_pre_attn_scalar, 256.0);
  EXPECT_EQ(d.sliding_window, 4096);
  EXPECT_EQ(d.num_key_value_heads, 4);
  EXPECT_EQ(d.head_dim, 256);
  EXPECT_EQ(d.layer_is_sliding, alternating(4, true));
  EXPECT_EQ(d.pad_token_id, 0);
}

TEST(ModelConfig, LoadReadsConfigJsonFromTheFolder) {
  std::string tmpl = ::testing::TempDir() + "loom_cfg_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  { std::ofstream(tmpl + "/config.json") << kQwen25; }
  auto c = ModelConfig::load(tmpl);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 3584);
  std::filesystem::remove_all(tmpl);

  auto missing = ModelConfig::load(tmpl);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(tmpl + "/config.json"), std::string::npos) << missing.status();
}

// ---- errors -------------------------------------------------------------------------------------

TEST(ModelConfigErrors, UnknownModelTypeListsTheSupportedOnes) {
  expect_error(minimal("phi"), {"'phi'", "llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, gemma3, phi3"});
  auto f = family_from_model_type("gpt2");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("llama, mistral, qwen2, qwen3, gemma, gemma2"), std::string::npos);
  EXPECT_EQ((*family_from_model_type("qwen3"))->name, "qwen3");
  EXPECT_EQ(family_from_architecture("Gemma2ForCausalLM")->name, "gemma2");
  EXPECT_EQ(family_from_architecture("Phi3ForCausalLM")->name, "phi3");
  EXPECT_EQ(family_from_architecture("PhiForCausalLM"), nullptr);  // Phi-2: another architecture
}

// Published Phi-3 configs (their shapes and RoPE keys): Phi-3-mini-4k (window 2047, no scaling),
// Phi-3.5-mini (LongRoPE, 48 factors per list, 4.x keys), Phi-4-mini (LongRoPE on 3/4 of each
// head: 48 factors for 96 rotated dims of 128, tied), and the 5.x form transformers writes back.
TEST(ModelConfig, Phi3FamilyConfigs) {
  json mini4k = {{"model_type", "phi3"}, {"vocab_size", 32064}, {"hidden_size", 3072}, {"intermediate_size", 8192},
                 {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 32},
                 {"max_position_embeddings", 4096}, {"original_max_position_embeddings", 4096},
                 {"rope_scaling", nullptr}, {"rope_theta", 10000.0}, {"sliding_window", 2047}, {"rms_norm_eps", 1e-5},
                 {"hidden_act", "silu"}, {"tie_word_embeddings", false}, {"bos_token_id", 1}, {"eos_token_id", 32000},
                 {"pad_token_id", 32000}};
  ModelConfig c = parse_ok(mini4k);
  EXPECT_EQ(c.sliding_window, 2047);
  EXPECT_TRUE(c.is_sliding(0) && c.is_sliding(31));
  EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::kDefault);
  EXPECT_EQ(c.rope.rotary_dim(c.head_dim), 96);
  EXPECT_TRUE(c.family->has_layer_module("self_attn.qkv_proj"));

  std::vector<double> f48(48, 1.0), long48(48, 2.5);
  json phi35 = mini4k;
  phi35["max_position_embeddings"] = 131072;
  phi35["sliding_window"] = 262144;
  phi35["rope_scaling"] = {{"type", "longrope"}, {"short_factor", f48}, {"long_factor", long48}};
  c = parse_ok(phi35);
  EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::kLongRope);
  EXPECT_EQ(c.rope.scaling.original_max_position_embeddings, 4096);
  // transformers: sqrt(1 + ln(131072 / 4096) / ln(4096)) = 1.19024
  EXPECT_NEAR(c.rope.scaling.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)), 1e-12);
  EXPECT_FALSE(c.rope.uses_long_factors(4095));
  EXPECT_TRUE(c.rope.uses_long_factors(4096));  // 4097 positions
  // The tables: inv_freq_i = 1 / (factor_i * theta^(2i/96)).
  EXPECT_NEAR(rope_inv_freq(c.head_dim, c.rope, true)[1] * 2.5, rope_inv_freq(c.head_dim, c.rope, false)[1], 1e-7);

  json phi4mini = phi35;
  phi4mini["vocab_size"] = 200064;
  phi4mini["num_attention_heads"] = 24;
  phi4mini["num_key_value_heads"] = 8;
  phi4mini["partial_rotary_factor"] = 0.75;
  phi4mini["tie_word_embeddings"] = true;
  c = parse_ok(phi4mini);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope.rotary_dim(c.head_dim), 96);
  EXPECT_EQ(rope_inv_freq(c.head_dim, c.rope).size(), 48u);
  phi4mini["rope_scaling"]["short_factor"] = std::vector<double>(64, 1.0);  // one per dim pair of the whole head: wrong
  phi4mini["rope_scaling"]["long_factor"] = std::vector<double>(64, 2.0);
  expect_error(phi4mini, {"LongRoPE has 64 factors per list", "96 rotated dims need 48"});

  // 5.x: rope_parameters with the pretrained length and the partial factor inside.
  json v5 = mini4k;
  v5.erase("rope_scaling");
  v5.erase("original_max_position_embeddings");
  v5["max_position_embeddings"] = 64;
  v5["head_dim"] = 16;
  v5["hidden_size"] = 64;
  v5["num_attention_heads"] = 4;
  v5["num_key_value_heads"] = 2;
  v5["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 10000.0}, {"original_max_position_embeddings", 8},
                           {"partial_rotary_factor", 0.5}, {"short_factor", {1.0, 1.3, 2.1, 3.7}},
                           {"long_factor", {1.1, 2.9, 7.3, 19.0}}};
  c = parse_ok(v5);
  EXPECT_EQ(c.rope.rotary_dim(16), 8);
  EXPECT_NEAR(c.rope.mscale(), std::sqrt(2.0), 1e-6);
  // Partial rotary is Phi-3's; a llama config with it is refused by name.
  json llama = minimal("llama");
  llama["partial_rotary_factor"] = 0.5;
  expect_error(llama, {"partial_rotary_factor", "not part of llama models"});
}

TEST(ModelConfigErrors, MissingRequiredFields) {
  for (const char* key :
       {"model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}) {
    json j = minimal("llama");
    j.erase(key);
    expect_error(j, {"missing required field", std::string("'") + key + "'"});
  }
  json j = minimal("llama");
  j["hidden_size"] = nullptr;
  expect_error(j, {"missing required field 'hidden_size'"});
}

TEST(ModelConfigErrors, WrongJsonTypes) {
  json j = minimal("llama");
  j["hidden_size"] = "4096";
  expect_error(j, {"'hidden_size'", "\"4096\"", "expected an integer"});
  j = minimal("llama");
  j["num_hidden_layers"] = 4.5;
  expect_error(j, {"'num_hidden_layers'", "expected an integer"});
  j = minimal("llama");
  j["tie_word_embeddings"] = "yes";
  expect_error(j, {"'tie_word_embeddings'", "true or false"});
  j = minimal("llama");
  j["rms_norm_eps"] = "1e-5";
  expect_error(j, {"'rms_norm_eps'", "a number"});
  j = minimal("llama");
  j["rope_scaling"] = "llama3";
  expect_error(j, {"'rope_scaling'", "an object"});
  j = minimal("llama");
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", "2"}};
  expect_error(j, {"'rope_scaling.factor'", "a number"});
  j = minimal("llama");
  j["eos_token_id"] = {1, "2"};
  expect_error(j, {"'eos_token_id'", "list of integers"});
  j = minimal("llama");
  j["model_type"] = 3;
  expect_error(j, {"'model_type'", "a string"});
  j = minimal("llama");
  j["hidden_size"] = -64;
  expect_error(j, {"'hidden_size'", "must be > 0"});
  j = minimal("llama");
  j["max_position_embeddings"] = 0;
  expect_error(j, {"'max_position_embeddings'", "must be >= 1"});
  // Sizes no model has, which would size an allocation (fuzz_config found 8888888888882 layers).
  j = minimal("qwen3");
  j["num_hidden_layers"] = 8888888888882;
  expect_error(j, {"'num_hidden_layers'", "is 8888888888882, past any plausible model (at most 65536)"});
  j = minimal("llama");
  j["vocab_size"] = int64_t{1} << 32;
  expect_error(j, {"'vocab_size'", "past any plausible model"});
  EXPECT_FALSE(ModelConfig::from_json_text("{\"model_type\": \"llama\",", kOrigin).ok());
  auto arr = ModelConfig::from_json_text("[1, 2]", kOrigin);
  ASSERT_FALSE(arr.ok());
  EXPECT_NE(arr.status().message().find(kOrigin), std::string::npos);
}

TEST(ModelConfigErrors, HeadsNotAMultipleOfKvHeads) {
  json j = minimal("llama");
  j["num_attention_heads"] = 6;
  j["hidden_size"] = 96;
  j["num_key_value_heads"] = 4;
  expect_error(j, {"num_attention_heads (6)", "num_key_value_heads (4)"});
  j = minimal("llama");
  j["hidden_size"] = 66;  // 66 / 4 heads, no head_dim
  expect_error(j, {"hidden_size (66)", "num_attention_heads (4)"});
  j = minimal("llama");
  j["head_dim"] = 15;
  expect_error(j, {"head_dim is 15", "even"});
}

TEST(ModelConfigErrors, UnsupportedRopeTypesAreNamed) {
  for (const char* type : {"yarn", "dynamic"}) {
    json j = minimal("llama");
    j["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}};
    expect_error(j, {"rope_scaling", std::string("'") + type + "'", "default, linear, llama3, longrope"});
    j.erase("rope_scaling");
    j["rope_parameters"] = {{"rope_type", type}, {"factor", 4.0}, {"rope_theta", 10000.0}};
    expect_error(j, {"rope_parameters", std::string("'") + type + "'", "default, linear, llama3, longrope"});
  }
  // LongRoPE (and Phi-3's legacy name for it) needs its two factor lists, one entry per frequency.
  for (const char* type : {"longrope", "su"}) {
    json j = minimal("llama");
    j["rope_scaling"] = {{"type", type}, {"factor", 4.0}};
    expect_error(j, {"rope_scaling.short_factor", "LongRoPE"});
    j["rope_scaling"]["short_factor"] = {1.0, 2.0};
    j["rope_scaling"]["long_factor"] = {1.0, 2.0};
    expect_error(j, {"LongRoPE has 2 factors per list"});
  }
  json j = minimal("llama");
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};  // the legacy key
  expect_error(j, {"'yarn'"});
}

TEST(ModelConfigErrors, PerLayerTypeRopeParametersAreRejected) {
  json j = minimal("gemma2");
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  expect_error(j, {"rope_parameters", "per-layer-type", "full_attention"});
}

TEST(ModelConfigErrors, Llama3RopeNeedsAllItsFields) {
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    json j = json::parse(kLlama31);
    j["rope_scaling"].erase(key);
    expect_error(j, {"missing required field", std::string("'rope_scaling.") + key + "'"});
    json k = json::parse(kLlama31v5);
    k["rope_parameters"].erase(key);
    expect_error(k, {std::string("'rope_parameters.") + key + "'"});
  }
  json j = json::parse(kLlama31);
  j["rope_scaling"]["high_freq_factor"] = 1.0;  // == low_freq_factor: a division by zero in the ramp
  expect_error(j, {"low_freq_factor", "high_freq_factor"});
  j = minimal("llama");
  j["rope_scaling"] = {{"rope_type", "linear"}};
  expect_error(j, {"'rope_scaling.factor'"});
  j = minimal("llama");
  j["rope_theta"] = 0;
  expect_error(j, {"rope_theta"});
}

TEST(ModelConfigErrors, QwenSlidingWindowIsRejected) {
  for (const char* type : {"qwen2", "qwen3"}) {
    json j = minimal(type);
    j["use_sliding_window"] = true;
    j["sliding_window"] = 4096;
    expect_error(j, {"'use_sliding_window'", "not supported"});
    j["use_sliding_window"] = false;
    j["layer_types"] = {"full_attention", "full_attention", "sliding_attention", "sliding_attention"};
    expect_error(j, {"'layer_types'", "sliding_attention"});
  }
}

TEST(ModelConfigErrors, UnsupportedActivation) {
  json j = minimal("llama");
  j["hidden_act"] = "gelu";
  expect_error(j, {"'hidden_act'", "\"gelu\"", "silu, gelu_pytorch_tanh"});
  j["hidden_act"] = "relu";
  expect_error(j, {"'hidden_act'", "relu"});
  j["hidden_act"] = "swish";  // ACT2FN's alias of silu
  EXPECT_EQ(parse_ok(j).hidden_act, "silu");
  j["hidden_act"] = "gelu_pytorch_tanh";
  EXPECT_EQ(parse_ok(j).hidden_act, "gelu_pytorch_tanh");
}

TEST(ModelConfigErrors, Gemma2LayerTypesMalformed) {
  json j = minimal("gemma2");
  j["layer_types"] = {"sliding_attention", "full_attention"};  // 2 entries for 4 layers
  expect_error(j, {"'layer_types'", "2 entries", "num_hidden_layers = 4"});
  j["layer_types"] = {"sliding_attention", "full_attention", "chunked_attention", "full_attention"};
  expect_error(j, {"'layer_types'", "chunked_attention"});
  j["layer_types"] = "alternate";
  expect_error(j, {"'layer_types'", "a list"});
}

}  // namespace
}  // namespace loom
