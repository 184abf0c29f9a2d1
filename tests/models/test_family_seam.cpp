// The model-family seam (models/family.h): the registry's lookups and every spec's consistency, the
// split/fuse rules of the weight map (a Phi-3-style spec with fused qkv_proj and gate_up_proj over
// the qwen2 fixture, whose reference is transformers' output for the unfused checkpoint), and RoPE
// tables per layer type.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/tensor_io.h"
#include "models/causal_lm.h"
#include "models/family.h"
#include "models/lora.h"
#include "models/weight_map.h"
#include "tests/models/fixtures.h"
#include "tests/temp_dir.h"

namespace loom::test {
namespace {

const FamilySpec& family(const std::string& model_type) { return **family_from_model_type(model_type); }

TEST(FamilyRegistry, LooksUpByModelTypeArchitectureAndGgufArchitecture) {
  for (const FamilySpec* f : model_families()) {
    ASSERT_FALSE(f->model_types.empty()) << f->name;
    EXPECT_EQ(f->model_types.front(), f->name);
    for (const std::string& t : f->model_types) EXPECT_EQ(*family_from_model_type(t), f) << t;
    for (const std::string& a : f->architectures) EXPECT_EQ(family_from_architecture(a), f) << a;
    if (!f->gguf_read_arch.empty()) {
      EXPECT_EQ(family_from_gguf_architecture(f->gguf_read_arch, f->moe.has_value()), f) << f->name;
    }
  }
  EXPECT_EQ(family_from_architecture("Qwen2ForCausalLM"), &family("qwen2"));
  EXPECT_EQ(family_from_gguf_architecture("llama"), &family("llama"));  // a llama GGUF is llama, never mistral
  EXPECT_EQ(family_from_gguf_architecture("llama", /*experts=*/true), &family("mixtral"));  // llama.expert_count > 0
  EXPECT_EQ(family_from_gguf_architecture("qwen3moe", true), &family("qwen3_moe"));
  EXPECT_EQ(family_from_gguf_architecture("qwen3moe", false), nullptr);
  EXPECT_EQ(family_from_gguf_architecture("qwen3", true), nullptr);
  EXPECT_EQ(family_from_gguf_architecture("mistral"), nullptr);
  EXPECT_EQ(family_from_gguf_architecture("phi3"), &family("phi3"));
  EXPECT_EQ(family_from_architecture("Phi3ForCausalLM"), &family("phi3"));
  EXPECT_EQ(family_from_gguf_architecture("phi2"), nullptr);
  EXPECT_FALSE(family_from_model_type("phi").ok());  // Phi-1/2: another architecture
}

// What the loader needs of every spec: a block, the modules every layer has, and split rules whose
// parts and row counts agree. A spec that breaks these is a Loom bug, caught here.
TEST(FamilyRegistry, EverySpecIsComplete) {
  for (const FamilySpec* f : model_families()) {
    EXPECT_NE(f->block, nullptr) << f->name;
    EXPECT_NE(f->parse, nullptr) << f->name;
    for (const char* m : {"model.embed_tokens", "model.norm", "lm_head"})
      EXPECT_NE(f->rule_for_loom(m, false), nullptr) << f->name << " " << m;
    for (const char* m : {"input_layernorm", "post_attention_layernorm", "self_attn.o_proj"})
      EXPECT_TRUE(f->has_layer_module(m)) << f->name << " " << m;
    // A dense MLP, or a mixture of experts whose router has a rule (its experts follow MoeSpec).
    if (f->moe) {
      EXPECT_TRUE(f->has_layer_module("mlp.gate")) << f->name;
      EXPECT_FALSE(f->moe->experts.empty() || f->moe->gate.empty() || f->moe->up.empty() || f->moe->down.empty())
          << f->name;
      if (!f->moe->rules.sparse_layers) continue;  // every layer MoE: no dense MLP to check
    }
    EXPECT_TRUE(f->has_layer_module("mlp.down_proj")) << f->name;
    // q, k and v (gate and up) as Loom modules of their own, or fused as Phi-3 keeps them.
    const bool qkv = f->has_layer_module("self_attn.q_proj") && f->has_layer_module("self_attn.k_proj") &&
                     f->has_layer_module("self_attn.v_proj");
    EXPECT_NE(qkv, f->has_layer_module("self_attn.qkv_proj")) << f->name;
    EXPECT_NE(f->has_layer_module("mlp.gate_proj") && f->has_layer_module("mlp.up_proj"),
              f->has_layer_module("mlp.gate_up_proj"))
        << f->name;
    for (const WeightRule& r : f->layer_weights) EXPECT_EQ(r.loom.size() < 2 ? 0 : r.loom.size(), r.rows.size()) << r.hf;
  }
  EXPECT_TRUE(family("qwen3").has_layer_module("self_attn.q_norm"));
  EXPECT_FALSE(family("qwen2").has_layer_module("self_attn.q_norm"));
  EXPECT_TRUE(family("gemma2").has_layer_module("post_feedforward_layernorm"));
  EXPECT_FALSE(family("gemma").has_layer_module("post_feedforward_layernorm"));
  EXPECT_TRUE(family("phi3").has_layer_module("self_attn.qkv_proj"));
  EXPECT_FALSE(family("phi3").has_layer_module("self_attn.q_proj"));
}

// Qwen2 with Phi-3's fused projections: llama.cpp's phi3 keeps them fused as attn_qkv and ffn_up.
FamilySpec fused_qwen2() {
  FamilySpec s = family("qwen2");
  s.name = "qwen2_fused";
  std::vector<WeightRule> layer;
  for (const WeightRule& r : s.layer_weights)
    if (!r.hf.ends_with("q_proj") && !r.hf.ends_with("k_proj") && !r.hf.ends_with("v_proj") &&
        !r.hf.ends_with("gate_proj") && !r.hf.ends_with("up_proj"))
      layer.push_back(r);
  layer.push_back({"self_attn.qkv_proj", "attn_qkv", GgufFix::kNone,
                   {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"},
                   {Rows::kQDim, Rows::kKvDim, Rows::kKvDim}});
  layer.push_back({"mlp.gate_up_proj", "ffn_up", GgufFix::kNone, {"mlp.gate_proj", "mlp.up_proj"},
                   {Rows::kIntermediate, Rows::kIntermediate}});
  s.layer_weights = layer;
  return s;
}

Tensor cat_rows(const std::vector<Tensor>& parts) {
  Shape shape = parts[0].shape();
  shape[0] = 0;
  for (const Tensor& p : parts) shape[0] += p.size(0);
  Tensor out = Tensor::empty(shape, parts[0].dtype());
  int64_t row = 0;
  for (const Tensor& p : parts) {
    out.narrow(0, row, p.size(0)).copy_(p);
    row += p.size(0);
  }
  return out;
}

// The qwen2 fixture rewritten with fused tensors (q|k|v and gate|up concatenated along rows, as
// Phi-3 checkpoints store them), and its config.json.
std::map<std::string, Tensor> write_fused_checkpoint(const std::string& dir) {
  auto in = read_all(fixture_dir("qwen2") + "/model.safetensors");
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : in) {
    const size_t at = name.find(".self_attn.q_proj.");
    const size_t mlp = name.find(".mlp.gate_proj.");
    if (at != std::string::npos) {
      const std::string pre = name.substr(0, at), suf = name.substr(at + 18);
      out[pre + ".self_attn.qkv_proj." + suf] = cat_rows({t, in.at(pre + ".self_attn.k_proj." + suf),
                                                          in.at(pre + ".self_attn.v_proj." + suf)});
    } else if (mlp != std::string::npos) {
      const std::string pre = name.substr(0, mlp), suf = name.substr(mlp + 15);
      out[pre + ".mlp.gate_up_proj." + suf] = cat_rows({t, in.at(pre + ".mlp.up_proj." + suf)});
    } else if (name.find("k_proj") == std::string::npos && name.find("v_proj") == std::string::npos &&
               name.find("up_proj") == std::string::npos) {
      out[name] = t;
    }
  }
  std::vector<std::pair<std::string, Tensor>> list(out.begin(), out.end());
  EXPECT_TRUE(save_tensors(dir + "/model.safetensors", list).ok());
  std::filesystem::copy_file(fixture_dir("qwen2") + "/config.json", dir + "/config.json");
  return out;
}

TEST(FamilySeam, FusedWeightsSplitOnLoadAndFuseOnSave) {
  TempDir dir("loom_fused");
  const auto fused = write_fused_checkpoint(dir.path());
  ASSERT_TRUE(fused.count("model.layers.1.self_attn.qkv_proj.bias"));  // qwen2's q/k/v biases are split too
  const FamilySpec spec = fused_qwen2();
  auto config = ModelConfig::load(dir.path());
  ASSERT_TRUE(config.ok()) << config.status();
  config->family = &spec;
  auto model = CausalLM::load(*config, dir.path(), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();

  // The same logits as transformers computed for the unfused checkpoint (test_families.cpp's f32 bound).
  auto in = read_all(fixture_dir("qwen2") + "/inputs.safetensors");
  auto ref = read_all(fixture_dir("qwen2") + "/reference.safetensors");
  {
    ag::NoGradGuard ng;
    EXPECT_LT(rel_err((*model)->forward(in["input_ids"]).value(), ref["logits"]), 2e-5);
  }
  // Loom keeps q/k/v and gate/up as separate Linears named as its own modules.
  EXPECT_EQ((*model)->linears()[1]->name, "model.layers.0.self_attn.k_proj");

  // Back to Hugging Face tensors: the fused ones, bit for bit.
  auto hf = hf_state_dict(**model);
  ASSERT_TRUE(hf.ok()) << hf.status();
  ASSERT_EQ(hf->size(), fused.size());
  for (const auto& [name, t] : *hf) {
    ASSERT_TRUE(fused.count(name)) << name;
    EXPECT_EQ(rel_err(t, fused.at(name)), 0.0) << name;
  }
  // save_pretrained writes the fused names.
  TempDir out("loom_fused_out");
  ASSERT_TRUE(save_pretrained(**model, out.path()).ok());
  auto saved = read_all(out.path() + "/model.safetensors");
  EXPECT_TRUE(saved.count("model.layers.0.mlp.gate_up_proj.weight"));
  EXPECT_FALSE(saved.count("model.layers.0.mlp.gate_proj.weight"));

  // GGUF names follow the Hugging Face tensor (llama.cpp's phi3 keeps attn_qkv fused).
  EXPECT_EQ(hf_to_gguf(spec, "model.layers.3.self_attn.qkv_proj.bias")->name, "blk.3.attn_qkv.bias");
  EXPECT_EQ(gguf_to_hf(spec, "blk.3.ffn_up.weight")->name, "model.layers.3.mlp.gate_up_proj.weight");
}

// A fused tensor with one part 4-bit cannot be written back whole: an error, never zero rows.
TEST(FamilySeam, AFusedTensorWithA4BitPartIsNotWrittenHalfEmpty) {
  TempDir dir("loom_fused_nf4");
  write_fused_checkpoint(dir.path());
  const FamilySpec spec = fused_qwen2();
  auto config = ModelConfig::load(dir.path());
  ASSERT_TRUE(config.ok()) << config.status();
  config->family = &spec;
  auto model = CausalLM::load(*config, dir.path(), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  Linear* k = (*model)->linears()[1];
  ASSERT_EQ(k->name, "model.layers.0.self_attn.k_proj");
  k->nf4 = std::make_shared<const Nf4Weight>(Nf4Weight::quantize(k->weight.value()));
  k->weight = ag::Variable();
  auto hf = hf_state_dict(**model);
  ASSERT_FALSE(hf.ok());
  EXPECT_EQ(hf.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(hf.status().message().find("model.layers.0.self_attn.qkv_proj.weight"), std::string::npos) << hf.status();
}

TEST(FamilySeam, AFusedSpecOnAnUnfusedCheckpointNamesTheMissingTensor) {
  const FamilySpec spec = fused_qwen2();
  auto config = ModelConfig::load(fixture_dir("qwen2"));
  ASSERT_TRUE(config.ok());
  config->family = &spec;
  auto model = CausalLM::load(*config, fixture_dir("qwen2"), {DType::f32, Device::cpu()});
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("model.layers.0.self_attn.qkv_proj.weight"), std::string::npos)
      << model.status();
}

// One sliding layer whose window covers the whole sequence (so it attends as a full layer would):
// its logits must depend on rope_sliding only. With the full layers' table it would follow `rope`.
TEST(FamilySeam, EachLayerGetsTheRopeTableOfItsType) {
  const char* kConfig = R"({"model_type": "gemma2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
    "sliding_window": 4096, "layer_types": ["sliding_attention"]})";
  auto base = ModelConfig::from_json_text(kConfig, "config.json");
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_TRUE(base->is_sliding(0));
  auto logits = [&](double full_theta, double sliding_theta) {
    ModelConfig c = *base;
    c.rope.theta = full_theta;
    c.rope_sliding.theta = sliding_theta;
    c.query_pre_attn_scalar = 1e-6;  // sharp attention from N(0, 0.02) weights, so that RoPE matters
    auto m = CausalLM::init_random(c, {DType::f32, Device::cpu()}, 7);  // the same weights every time
    EXPECT_TRUE(m.ok()) << m.status();
    ag::NoGradGuard ng;
    return (*m)->forward(Tensor::from_ints({1, 5, 9, 20, 33, 2, 41, 60}, {1, 8})).value();
  };
  const Tensor mixed = logits(10000, 50), sliding_only = logits(50, 50), full_only = logits(10000, 10000);
  EXPECT_EQ(rel_err(mixed, sliding_only), 0.0);
  EXPECT_GT(rel_err(mixed, full_only), 1e-4);
}

}  // namespace
}  // namespace loom::test
