// GGUF -> Hugging Face mapping: config.json fields from the metadata, tensor names, and weights equal
// to the Hugging Face tensors tools/reference/make_gguf_fixtures.py started from (the q/k permutation undone,
// checked against gguf-py's dequantisation and convert_hf_to_gguf.py's permute); CausalLM loads a
// .gguf directly and gives the same logits as the same weights loaded from a safetensors folder.
#include "models/family.h"
#include "models/gguf_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>

#include "engine/gguf_writer.h"
#include "engine/safetensors.h"
#include "engine/tensor_io.h"
#include "models/causal_lm.h"
#include "models/gguf_export.h"
#include "models/lora.h"
#include "tests/models/fixtures.h"
#include "tests/temp_dir.h"

namespace loom {
namespace {

// The registered family of a model_type (the test names only supported ones).
const FamilySpec& family(const std::string& model_type) { return **family_from_model_type(model_type); }


const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/gguf/";

void expect_matches_expected(const std::map<std::string, Tensor>& got, const std::string& expected_path) {
  auto ex = SafetensorsFile::open(expected_path);
  ASSERT_TRUE(ex.ok()) << ex.status();
  size_t names = 0;
  for (const TensorInfo& info : ex->tensors()) {
    const bool head = info.name.ends_with(":head"), rowsum = info.name.ends_with(":rowsum");
    const std::string hf = head ? info.name.substr(0, info.name.size() - 5)
                                : rowsum ? info.name.substr(0, info.name.size() - 7) : info.name;
    SCOPED_TRACE(info.name);
    auto it = got.find(hf);
    ASSERT_NE(it, got.end()) << "no tensor " << hf;
    const Tensor& t = it->second;
    const Tensor e = read_tensor(*ex, info);
    const float* p = t.data<float>();
    if (rowsum) {
      ASSERT_EQ(t.dim(), 2);
      const int64_t cols = t.size(1);
      for (int64_t r = 0; r < t.size(0); ++r) {
        double s = 0;
        for (int64_t c = 0; c < cols; ++c) s += p[r * cols + c];
        ASSERT_NEAR(s, e.data<double>()[r], 1e-9 * (1 + std::abs(s))) << "row " << r;
      }
      continue;
    }
    ++names;
    if (!head) {
      ASSERT_EQ(t.shape(), e.shape());
    }
    for (int64_t i = 0; i < e.numel(); ++i) ASSERT_EQ(p[i], e.data<float>()[i]) << "element " << i;
  }
  EXPECT_EQ(names, got.size());  // every tensor Loom produced is one the script made
}

TEST(GgufModel, LlamaConfigFromMetadata) {
  auto f = GgufFile::open(kDir + "tiny_llama.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  auto j = gguf_hf_config(*f);
  ASSERT_TRUE(j.ok()) << j.status();
  auto c = ModelConfig::from_json_text(j->dump(), "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family->name, "llama");
  EXPECT_EQ(c->vocab_size, 66);
  EXPECT_EQ(c->hidden_size, 32);
  EXPECT_EQ(c->intermediate_size, 256);
  EXPECT_EQ(c->num_hidden_layers, 3);
  EXPECT_EQ(c->num_attention_heads, 4);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->max_position_embeddings, 128);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);  // the f32 in the file printed as the shortest decimal
  EXPECT_EQ(c->rope.theta, 50000.0);
  EXPECT_EQ(c->rope.scaling.kind, RopeScaling::Kind::kLinear);
  EXPECT_EQ(c->rope.scaling.factor, 2.0);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_id, 2);
  EXPECT_EQ(c->pad_token_id, 0);
  EXPECT_EQ((*j)["architectures"][0], "LlamaForCausalLM");
}

TEST(GgufModel, LlamaTensorsEqualTheHuggingFaceOnes) {
  auto m = load_gguf_model(kDir + "tiny_llama.gguf");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tensors.size(), 1u + 3 * 9 + 1);
  expect_matches_expected(m->tensors, kDir + "tiny_llama.expected.safetensors");
}

TEST(GgufModel, Qwen2BiasesUntiedAndNotPermuted) {
  auto m = load_gguf_model(kDir + "tiny_qwen2.gguf");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.family->name, "qwen2");
  EXPECT_FALSE(m->config.tie_word_embeddings);
  EXPECT_TRUE(m->config.attention_bias);
  EXPECT_EQ(m->config.rope.theta, 1e6);
  EXPECT_EQ(m->config.rms_norm_eps, 1e-6);
  EXPECT_TRUE(m->tensors.count("lm_head.weight"));
  expect_matches_expected(m->tensors, kDir + "tiny_qwen2.expected.safetensors");
}

TEST(GgufModel, TensorNames) {
  EXPECT_EQ(gguf_to_hf_name("blk.12.attn_q.weight", family("llama")), "model.layers.12.self_attn.q_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.0.attn_k.bias", family("qwen2")), "model.layers.0.self_attn.k_proj.bias");
  EXPECT_EQ(gguf_to_hf_name("blk.1.ffn_norm.weight", family("llama")), "model.layers.1.post_attention_layernorm.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.1.ffn_norm.weight", family("gemma2")), "model.layers.1.pre_feedforward_layernorm.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.1.post_ffw_norm.weight", family("gemma2")),
            "model.layers.1.post_feedforward_layernorm.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.1.post_ffw_norm.weight", family("llama")), "");
  EXPECT_EQ(gguf_to_hf_name("blk.2.attn_q_norm.weight", family("qwen3")), "model.layers.2.self_attn.q_norm.weight");
  EXPECT_EQ(gguf_to_hf_name("output.weight", family("llama")), "lm_head.weight");
  EXPECT_EQ(gguf_to_hf_name("token_embd.weight", family("gemma")), "model.embed_tokens.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.x.attn_q.weight", family("llama")), "");
  EXPECT_EQ(gguf_to_hf_name("rope_freqs.weight", family("llama")), "");
}

TEST(GgufModel, UnpermuteRows) {
  // 2 heads of head_dim 4: file rows per head are (i, k) pairs, HF rows (k, i).
  std::vector<float> v(8);
  for (int i = 0; i < 8; ++i) v[i] = static_cast<float>(i);
  const Tensor t = unpermute_rope_rows(Tensor::from_floats(v, {8}), 2);
  EXPECT_EQ(t.to_floats(), (std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7}));
}

TEST(GgufModel, CausalLmLoadsAGgufLikeTheSameWeightsInAFolder) {
  const std::string path = kDir + "tiny_llama.gguf";
  auto direct = CausalLM::load(path, {DType::f32, Device::cpu()});
  ASSERT_TRUE(direct.ok()) << direct.status();
  // The same weights written as a Hugging Face folder and loaded the usual way.
  auto m = load_gguf_model(path);
  ASSERT_TRUE(m.ok());
  test::TempDir dir("loom_gguf");
  std::ofstream(dir.file("config.json")) << m->config_json.dump(2);
  std::vector<std::pair<std::string, Tensor>> named(m->tensors.begin(), m->tensors.end());
  ASSERT_TRUE(save_tensors(dir.file("model.safetensors"), named).ok());
  auto folder = CausalLM::load(dir.path(), {DType::f32, Device::cpu()});
  ASSERT_TRUE(folder.ok()) << folder.status();
  const Tensor ids = Tensor::from_ints({1, 5, 9, 30, 42, 7, 64, 2}, {1, 8});
  const std::vector<float> a = (*direct)->forward(ids).value().to_floats();
  const std::vector<float> b = (*folder)->forward(ids).value().to_floats();
  ASSERT_EQ(a.size(), 8u * 66);
  EXPECT_EQ(a, b);
  for (float x : a) ASSERT_TRUE(std::isfinite(x));
}

TEST(GgufModel, SavePretrainedFromAGgufWritesItsConfig) {
  auto m = CausalLM::load(kDir + "tiny_qwen2.gguf", {DType::f32, Device::cpu()});
  ASSERT_TRUE(m.ok()) << m.status();
  test::TempDir dir("loom_gguf_save");
  ASSERT_TRUE(save_pretrained(**m, dir.path()).ok());
  auto folder = CausalLM::load(dir.path(), {DType::bf16, Device::cpu()});
  ASSERT_TRUE(folder.ok()) << folder.status();
  auto direct = CausalLM::load(kDir + "tiny_qwen2.gguf", {DType::bf16, Device::cpu()});
  ASSERT_TRUE(direct.ok());
  const Tensor ids = Tensor::from_ints({3, 1, 4, 1, 5}, {1, 5});
  EXPECT_EQ((*folder)->forward(ids).value().to_floats(), (*direct)->forward(ids).value().to_floats());
  EXPECT_EQ((*folder)->config().model_type, "qwen2");
}

// `loom export`'s gemma3 file as convert_hf_to_gguf.py's Gemma3Model writes one (names as gguf-py's
// TensorNameMap(MODEL_ARCH.GEMMA3) gives them; every norm, q/k norms included, stored as 1 + w) and
// what Loom reads back from it: w again, as (1 + w) - 1 in f32.
TEST(GgufModel, Gemma3FileHoldsLlamaCppNamesKeysAndNormsPlusOne) {
  test::TempDir dir("loom_gguf_gemma3");
  test::copy_fixture("gemma3", dir.path(), test::gemma3_llama_cpp_patch());
  auto model = CausalLM::load(dir.path(), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  GgufWriter w;
  ASSERT_TRUE(add_gguf_model(**model, GgmlType::F16, "g", w).ok());
  ASSERT_TRUE(w.write(dir.file("g.gguf")).ok());
  auto f = GgufFile::open(dir.file("g.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();

  EXPECT_EQ(*f->get_string("general.architecture"), "gemma3");
  for (const auto& [key, want] : std::vector<std::pair<std::string, int64_t>>{
           {"block_count", 2}, {"context_length", 256}, {"embedding_length", 64}, {"feed_forward_length", 96},
           {"attention.head_count", 4}, {"attention.head_count_kv", 2}, {"attention.key_length", 16},
           {"attention.value_length", 16}, {"attention.sliding_window", 4}})
    EXPECT_EQ(f->get_int("gemma3." + key).value_or(-1), want) << key;
  EXPECT_EQ(f->get_float("gemma3.rope.freq_base").value_or(0), 1e6);
  EXPECT_EQ(*f->get_string("gemma3.rope.scaling.type"), "linear");
  EXPECT_EQ(f->get_float("gemma3.rope.scaling.factor").value_or(0), 8.0);
  EXPECT_EQ(f->get_float("gemma3.attention.layer_norm_rms_epsilon").value_or(0), static_cast<double>(1e-6f));
  for (const char* absent : {"gemma3.final_logit_softcapping", "gemma3.attn_logit_softcapping", "gemma3.rope.dimension_count"})
    EXPECT_FALSE(f->has(absent)) << absent;

  std::set<std::string> want = {"token_embd.weight", "output_norm.weight"};  // tied: no output.weight
  for (int i = 0; i < 2; ++i)
    for (const char* t : {"attn_norm", "attn_q", "attn_q_norm", "attn_k", "attn_k_norm", "attn_v", "attn_output",
                          "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"})
      want.insert(absl::StrCat("blk.", i, ".", t, ".weight"));
  std::set<std::string> names;
  for (const GgufTensorInfo& t : f->tensors()) names.insert(t.name);
  EXPECT_EQ(names, want);

  auto hf = load_tensors(test::fixture_dir("gemma3") + "/model.safetensors");
  ASSERT_TRUE(hf.ok()) << hf.status();
  auto back = gguf_hf_tensors(*f, model->get()->config());
  ASSERT_TRUE(back.ok()) << back.status();
  int norms = 0;
  for (const GgufTensorInfo& info : f->tensors()) {
    const std::string name = gguf_to_hf_name(info.name, family("gemma3_text"));
    SCOPED_TRACE(info.name + " " + name);
    ASSERT_TRUE(hf->count(name));
    if (!info.name.ends_with("norm.weight")) {
      EXPECT_EQ(info.type, GgmlType::F16);
      continue;
    }
    ++norms;
    EXPECT_EQ(info.type, GgmlType::F32);
    auto stored = f->read_f32(info);
    ASSERT_TRUE(stored.ok());
    const float* w0 = hf->at(name).data<float>();
    const float* s1 = stored->data<float>();
    const float* b = back->at(name).data<float>();
    for (int64_t i = 0; i < stored->numel(); ++i) {
      ASSERT_EQ(s1[i], w0[i] + 1.f) << i;
      ASSERT_EQ(b[i], s1[i] - 1.f) << i;
      ASSERT_NEAR(b[i], w0[i], 0x1p-24f) << i;
    }
  }
  EXPECT_EQ(norms, 1 + 2 * 6);
}

// gguf_hf_config of llama.cpp's gemma3 metadata (what convert_hf_to_gguf.py writes for a 4B-shaped
// model): the keys transformers' Gemma3TextConfig reads (4.x spellings, which 5.x converts), with what
// llama.cpp runs that the file does not say: every 6th layer full, local base 10000 unscaled, and
// the attention scale head_dim^-0.5, or (hidden / heads)^-0.5 for 62 layers.
TEST(GgufModel, Gemma3ConfigFromMetadata) {
  test::TempDir dir("loom_gguf_gemma3_cfg");
  auto config_of = [&](int64_t layers, bool window, bool softcap,
                       const std::vector<std::pair<std::string, GgufValue>>& extra = {}) {
    GgufWriter w;
    w.add("general.architecture", gguf_string("gemma3"));
    for (const auto& [key, v] : std::vector<std::pair<std::string, uint32_t>>{
             {"block_count", static_cast<uint32_t>(layers)}, {"context_length", 131072}, {"embedding_length", 64},
             {"feed_forward_length", 96}, {"attention.head_count", 4}, {"attention.head_count_kv", 2},
             {"attention.key_length", 8}, {"attention.value_length", 8}})
      w.add("gemma3." + key, gguf_u32(v));
    w.add("gemma3.rope.freq_base", gguf_f32(1e6f));
    w.add("gemma3.attention.layer_norm_rms_epsilon", gguf_f32(1e-6f));
    w.add("gemma3.rope.scaling.type", gguf_string("linear"));
    w.add("gemma3.rope.scaling.factor", gguf_f32(8.f));
    if (window) w.add("gemma3.attention.sliding_window", gguf_u32(1024));
    if (softcap) w.add("gemma3.final_logit_softcapping", gguf_f32(30.f));
    for (const auto& [key, value] : extra) w.add(key, value);
    w.add_tensor("token_embd.weight", Tensor::zeros({100, 64}, DType::f32, Device::cpu()), GgmlType::F32);
    EXPECT_TRUE(w.write(dir.file("c.gguf")).ok());
    auto f = GgufFile::open(dir.file("c.gguf"));
    EXPECT_TRUE(f.ok()) << f.status();
    auto j = gguf_hf_config(*f);
    EXPECT_TRUE(j.ok()) << j.status();
    return j.ok() ? *j : nlohmann::json();
  };
  nlohmann::json j = config_of(34, true, false);
  EXPECT_EQ(j["model_type"], "gemma3_text");
  EXPECT_EQ(j["architectures"], nlohmann::json({"Gemma3ForCausalLM"}));
  EXPECT_EQ(j["vocab_size"], 100);
  EXPECT_EQ(j["head_dim"], 8);
  EXPECT_EQ(j["query_pre_attn_scalar"], 8);
  EXPECT_EQ(j["sliding_window"], 1024);
  EXPECT_EQ(j["sliding_window_pattern"], 6);
  EXPECT_EQ(j["rope_theta"], 1e6);
  EXPECT_EQ(j["rope_scaling"], nlohmann::json({{"rope_type", "linear"}, {"factor", 8.0}}));
  EXPECT_EQ(j["rope_local_base_freq"], 10000.0);
  EXPECT_EQ(j["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_TRUE(j["attn_logit_softcapping"].is_null() && j["final_logit_softcapping"].is_null());
  std::vector<bool> sliding(34, true);
  for (int i : {5, 11, 17, 23, 29}) sliding[i] = false;
  ASSERT_EQ(j["layer_types"].size(), 34u);
  for (int i = 0; i < 34; ++i) EXPECT_EQ(j["layer_types"][i], sliding[i] ? "sliding_attention" : "full_attention") << i;
  auto c = ModelConfig::from_json_text(j.dump(), "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, &family("gemma3_text"));
  EXPECT_EQ(c->layer_is_sliding, sliding);
  EXPECT_EQ(c->rope.scaling.kind, RopeScaling::Kind::kLinear);
  EXPECT_EQ(c->rope_sliding.theta, 10000.0);
  EXPECT_EQ(c->rope_sliding.scaling.kind, RopeScaling::Kind::kDefault);
  EXPECT_FLOAT_EQ(c->attention_scale(), 1.f / std::sqrt(8.f));

  EXPECT_EQ(config_of(62, true, false)["query_pre_attn_scalar"], 16);  // 27B: hidden / heads
  j = config_of(4, false, true);  // no window: no layer slides, and the final soft-cap counts
  EXPECT_EQ(j["layer_types"], nlohmann::json(std::vector<std::string>(4, "full_attention")));
  EXPECT_EQ(j["sliding_window_pattern"], 1);
  EXPECT_EQ(j["final_logit_softcapping"], 30.0);
  c = ModelConfig::from_json_text(j.dump(), "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->layer_is_sliding, std::vector<bool>(4, false));
  EXPECT_EQ(c->final_logit_softcapping, 30.f);
  // Keys convert_hf_to_gguf.py does not write but newer llama.cpp builds read for gemma3: the period
  // of set_swa_pattern and the sliding layers' base.
  j = config_of(5, true, false, {{"gemma3.attention.sliding_window_pattern", gguf_u32(2)},
                                 {"gemma3.rope.freq_base_swa", gguf_f32(5000.f)}});
  EXPECT_EQ(j["layer_types"], nlohmann::json({"sliding_attention", "full_attention", "sliding_attention",
                                              "full_attention", "sliding_attention"}));
  EXPECT_EQ(j["sliding_window_pattern"], 2);
  EXPECT_EQ(j["rope_local_base_freq"], 5000.0);
  c = ModelConfig::from_json_text(j.dump(), "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->layer_is_sliding, (std::vector<bool>{true, false, true, false, true}));
  EXPECT_EQ(c->rope_sliding.theta, 5000.0);
  // A corrupt block count (fuzz_gguf's kind of input) builds no layer list; config parsing names it.
  j = config_of(4000000000, true, false);
  EXPECT_FALSE(j.contains("layer_types"));
  c = ModelConfig::from_json_text(j.dump(), "x");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("num_hidden_layers"), std::string::npos) << c.status();
  j = config_of(3, true, false, {{"gemma3.attention.sliding_window_pattern", gguf_u32(0)}});  // 0: all slide
  EXPECT_EQ(j["layer_types"], nlohmann::json(std::vector<std::string>(3, "sliding_attention")));
  EXPECT_FALSE(j.contains("sliding_window_pattern"));
}

TEST(GgufModel, Errors) {
  auto bad = CausalLM::load(kDir + "missing.gguf", {DType::f32, Device::cpu()});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("missing.gguf"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace loom
