// GGUF export: a model (+ its PEFT adapter, merged) written with add_gguf_model and read back by Loom's
// own GGUF reader gives the logits of the model it came from. f16 and bf16: equal to the source with
// its matrices rounded the same way (round to nearest even through kernels/common.h and
// f32_to_fp16), so only the file's layout, names, permutation and metadata are under test; q8_0:
// equal to the source with its matrices put through ggml's Q8_0 rule (written out here from
// ggml-quants.c's quantize_row_q8_0_ref). The values themselves are checked independently by
// tools/check/check_gguf_export.py (bit for bit against gguf-py's own Q8_0 quantiser and dequantiser).
#include "models/gguf_export.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "engine/gguf_writer.h"
#include "engine/tensor_io.h"
#include "kernels/common.h"
#include "tests/models/fixtures.h"
#include "models/family.h"
#include "models/gguf_model.h"
#include "models/lora.h"
#include "nlohmann/json.hpp"
#include "tests/temp_dir.h"

namespace loom {
namespace {

// The registered family of a model_type (the test names only supported ones).
const FamilySpec& family(const std::string& model_type) { return **family_from_model_type(model_type); }


struct Source {
  std::string model, adapter;  // adapter "" for none
};

std::unique_ptr<CausalLM> load_merged(const Source& s) {
  auto m = CausalLM::load(s.model, {DType::f32, Device::cpu()});
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  if (!s.adapter.empty()) {
    auto lc = load_adapter(**m, s.adapter);
    EXPECT_TRUE(lc.ok()) << lc.status();
    merge_lora(**m);
  }
  return *std::move(m);
}

// Every matrix of the model rounded in place as the file stores it.
void round_matrices(CausalLM& m, GgmlType type) {
  for (auto& [name, v] : m.named_weights()) {
    if (v->value().dim() != 2) continue;
    float* p = v->value().data<float>();
    const int64_t n = v->value().numel();
    if (type == GgmlType::Q8_0) {
      ASSERT_EQ(v->value().size(1) % 32, 0) << name;
      for (int64_t b = 0; b < n; b += 32) {  // d = max|x| / 127 stored as f16; q = round(x / d) away from zero
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(p[b + j]));
        const float d = amax / 127.f, id = d != 0 ? 1.f / d : 0.f, d16 = fp16_to_f32(f32_to_fp16(d));
        for (int j = 0; j < 32; ++j) p[b + j] = std::round(p[b + j] * id) * d16;
      }
      continue;
    }
    for (int64_t i = 0; i < n; ++i)
      p[i] = type == GgmlType::F16 ? fp16_to_f32(f32_to_fp16(p[i])) : bf16_to_float(float_to_bf16(p[i]));
  }
}

// Two rows of 12 ids, or of the sliding window's length when the file's family is another: mistral is
// written as llama, which llama.cpp runs without the window, so only rows that fit in it compare.
Tensor ids_for(const CausalLM& m, const CausalLM& back) {
  const int64_t window = m.config().sliding_window;
  const int64_t seq = window > 0 && back.config().family != m.config().family ? std::min<int64_t>(12, window) : 12;
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < 2 * seq; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 5) % m.config().vocab_size));
  return Tensor::from_ints(ids, {2, seq});
}

std::unique_ptr<CausalLM> export_and_load(const CausalLM& m, GgmlType type, const std::string& path) {
  GgufWriter w;
  EXPECT_TRUE(add_gguf_model(m, type, "test", w).ok());
  const absl::Status s = w.write(path);
  EXPECT_TRUE(s.ok()) << s;
  auto back = CausalLM::load(path, {DType::f32, Device::cpu()});
  EXPECT_TRUE(back.ok()) << back.status();
  return back.ok() ? *std::move(back) : nullptr;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

// Gemma 3 sources that llama.cpp's gemma3 holds (the fixture as it is cannot: see
// test::gemma3_llama_cpp_patch): the fixture so changed, with its adapter, and 7 layers of its
// weights, whose layer 5 attends fully with the global RoPE (base 1e6, linear x8) and the others
// slide (window 4 of the 12 positions, base 10000).
const std::string& gemma3_dir(bool seven_layers) {
  static const test::TempDir two("loom_gguf_gemma3"), seven("loom_gguf_gemma3_7");
  static const bool made = [] {
    test::copy_fixture("gemma3", two.path(), test::gemma3_llama_cpp_patch());
    nlohmann::json patch = test::gemma3_llama_cpp_patch();
    patch["layer_types"] = nullptr;  // sliding_window_pattern 6
    test::copy_fixture("gemma3", seven.path(), patch, 7);
    return true;
  }();
  (void)made;
  return seven_layers ? seven.path() : two.path();
}

std::vector<Source> sources() {
  return {{test::fixture_dir("mistral"), test::fixture_dir("mistral") + "/adapter"},
          {test::fixture_dir("qwen2"), test::fixture_dir("qwen2") + "/adapter"},
          {test::fixture_dir("qwen3"), test::fixture_dir("qwen3") + "/adapter"},
          // llama.cpp's phi3: fused attn_qkv and ffn_up, the window, LongRoPE's factor tensors and
          // attention factor, partial rotary as rope.dimension_count (the adapter on the fused modules merged).
          {test::fixture_dir("phi3"), test::fixture_dir("phi3") + "/adapter"},
          {test::fixture_dir("phi3_longrope"), test::fixture_dir("phi3_longrope") + "/adapter"},
          // llama.cpp's gemma3: sandwich and q/k norms stored as (1 + w), the every-6th-layer pattern, the
          // window, the global RoPE's linear factor, the local base 10000 and head_dim^-0.5 implied.
          {gemma3_dir(false), test::fixture_dir("gemma3") + "/adapter"},
          {gemma3_dir(true), ""},
          {std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/gguf/tiny_llama.gguf", ""}};
}

TEST(GgufExport, ReadBackGivesTheSourceLogitsWithTheSameRounding) {
  test::TempDir dir;
  for (const Source& s : sources())
    for (GgmlType type : {GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
      SCOPED_TRACE(testing::Message() << s.model << " " << ggml_type_name(type));
      auto src = load_merged(s);
      ASSERT_TRUE(src);
      auto back = export_and_load(*src, type, dir.file("m.gguf"));
      ASSERT_TRUE(back);
      EXPECT_EQ(back->config().num_key_value_heads, src->config().num_key_value_heads);
      EXPECT_EQ(back->config().tie_word_embeddings, src->config().tie_word_embeddings);
      if (back->config().family == src->config().family) {  // not mistral, which is written as llama without its window
        EXPECT_EQ(back->config().sliding_window, src->config().sliding_window);
        EXPECT_EQ(back->config().rope.rotary_dim(back->config().head_dim),
                  src->config().rope.rotary_dim(src->config().head_dim));
        EXPECT_EQ(back->config().rope.scaling.kind, src->config().rope.scaling.kind);
        auto f32 = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
        EXPECT_EQ(f32(back->config().rope.scaling.long_factor), f32(src->config().rope.scaling.long_factor));
        EXPECT_EQ(f32(back->config().rope.scaling.short_factor), f32(src->config().rope.scaling.short_factor));
        EXPECT_EQ(back->config().rope.mscale(), src->config().rope.mscale());
        EXPECT_EQ(back->config().rope.scaling.factor, src->config().rope.scaling.factor);
        EXPECT_EQ(back->config().layer_is_sliding, src->config().layer_is_sliding);
        if (back->config().rope_sliding.scaling.kind != RopeScaling::Kind::kLongRope) {  // (factors compared above)
          EXPECT_TRUE(back->config().rope_sliding == src->config().rope_sliding);
        }
        EXPECT_EQ(back->config().attention_scale(), src->config().attention_scale());
        EXPECT_EQ(back->config().final_logit_softcapping, src->config().final_logit_softcapping);
      }
      const Tensor ids = ids_for(*src, *back);
      const auto unrounded = src->forward(ids).value().to_floats();
      round_matrices(*src, type);
      const auto want = src->forward(ids).value().to_floats(), got = back->forward(ids).value().to_floats();
      // The same weights through the same kernels: only the config's f32 round trip (rms eps, rope
      // base) may differ, far below this.
      EXPECT_LE(max_abs_diff(got, want), 1e-5f);
      EXPECT_GT(max_abs_diff(got, unrounded), 0.f);  // the file was rounded for real
    }
}

TEST(GgufExport, NamesAndPermutationInvertTheReader) {
  for (const FamilySpec* f : {&family("llama"), &family("qwen2"), &family("qwen3")})
    for (const char* g : {"token_embd.weight", "output_norm.weight", "output.weight", "blk.0.attn_q.weight",
                          "blk.12.attn_k.bias", "blk.3.ffn_down.weight", "blk.1.ffn_norm.weight"})
      EXPECT_EQ(hf_to_gguf_name(gguf_to_hf_name(g, *f), *f), g);
  for (const char* g : {"blk.0.attn_qkv.weight", "blk.3.ffn_up.weight", "blk.1.attn_output.weight", "output.weight"})
    EXPECT_EQ(hf_to_gguf_name(gguf_to_hf_name(g, family("phi3")), family("phi3")), g);
  EXPECT_EQ(gguf_to_hf_name("blk.2.attn_qkv.weight", family("phi3")), "model.layers.2.self_attn.qkv_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.2.ffn_up.weight", family("phi3")), "model.layers.2.mlp.gate_up_proj.weight");
  EXPECT_EQ(hf_to_gguf_name("model.layers.2.self_attn.q_norm.weight", family("qwen3")), "blk.2.attn_q_norm.weight");
  EXPECT_EQ(hf_to_gguf_name("model.layers.2.self_attn.q_norm.weight", family("llama")), "");
  for (const char* g : {"token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight", "blk.0.attn_q_norm.weight",
                        "blk.1.attn_k_norm.weight", "blk.1.post_attention_norm.weight", "blk.1.ffn_norm.weight",
                        "blk.0.post_ffw_norm.weight", "blk.0.ffn_gate.weight"})
    EXPECT_EQ(hf_to_gguf_name(gguf_to_hf_name(g, family("gemma3_text")), family("gemma3_text")), g);
  std::vector<float> v(4 * 8 * 3);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const Tensor t = Tensor::from_floats(v, {32, 3});
  EXPECT_EQ(unpermute_rope_rows(permute_rope_rows(t, 4), 4).to_floats(), v);
  // Head 0 of 8 rows: Hugging Face rows 0..3 are the first halves, 4..7 the second; the file interleaves.
  const auto p = permute_rope_rows(t, 4).to_floats();
  for (int r : {0, 1, 2, 3}) {
    EXPECT_EQ(p[(2 * r) * 3], v[r * 3]);
    EXPECT_EQ(p[(2 * r + 1) * 3], v[(r + 4) * 3]);
  }
}

TEST(GgufExport, RefusesWhatTheFormatCannotHold) {
  auto gemma = CausalLM::load(test::fixture_dir("gemma"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(gemma.ok());
  GgufWriter w;
  EXPECT_EQ(add_gguf_model(**gemma, GgmlType::F16, "x", w).code(), absl::StatusCode::kUnimplemented);
  auto llama = CausalLM::load(test::fixture_dir("llama"), {DType::f32, Device::cpu()});  // rope_type llama3
  ASSERT_TRUE(llama.ok());
  GgufWriter w2;
  const absl::Status s = add_gguf_model(**llama, GgmlType::F16, "x", w2);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("llama3"), std::string_view::npos) << s;
}

// What llama.cpp's gemma3 would run differently is refused before anything is written, naming the
// config field; a model without sliding layers keeps its final soft-cap (llama.cpp applies it then).
TEST(GgufExport, Gemma3RefusesWhatLlamaCppCannotHold) {
  auto as_is = CausalLM::load(test::fixture_dir("gemma3"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(as_is.ok()) << as_is.status();
  GgufWriter w;
  absl::Status s = add_gguf_model(**as_is, GgmlType::F16, "x", w);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("layer_types[1] is full_attention"), std::string_view::npos) << s;
  EXPECT_FALSE(w.has("general.architecture"));

  std::ifstream in(test::fixture_dir("gemma3") + "/config.json");
  nlohmann::json base = nlohmann::json::parse(in);
  base.merge_patch(test::gemma3_llama_cpp_patch());
  auto export_with = [&](const nlohmann::json& patch, GgufWriter& out) {
    nlohmann::json j = base;
    j.merge_patch(patch);
    auto c = ModelConfig::from_json_text(j.dump(), "config.json");
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return c.status();
    auto m = CausalLM::init_random(*c, {DType::f32, Device::cpu()}, 3);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? add_gguf_model(**m, GgmlType::F32, "x", out) : m.status();
  };
  const std::vector<std::pair<nlohmann::json, std::string>> refused = {
      {{{"query_pre_attn_scalar", 24}}, "query_pre_attn_scalar is 24, but llama.cpp scales attention by 16^-0.5"},
      {{{"rope_parameters", {{"sliding_attention", {{"rope_theta", 5000.0}}}}}},
       "gives sliding-window layers RoPE base 10000, unscaled; this model's sliding layers have base 5000"},
      {{{"rope_parameters", {{"sliding_attention", {{"rope_type", "linear"}, {"factor", 2.0}}}}}},
       "this model's sliding layers have base 10000, linear x2"},
      {{{"attn_logit_softcapping", 50.0}}, "attn_logit_softcapping is 50"},
      {{{"final_logit_softcapping", 30.0}}, "final_logit_softcapping is 30"},
      {{{"attention_bias", true}}, "attention_bias"},
      {{{"hidden_activation", "silu"}}, "hidden_activation is silu"},
      {{{"rope_parameters", {{"full_attention", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                                 {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}}}}}},
       "llama3"},
  };
  for (const auto& [patch, message] : refused) {
    GgufWriter out;
    s = export_with(patch, out);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << patch << " " << s;
    EXPECT_NE(s.message().find(message), std::string_view::npos) << patch << " " << s;
    EXPECT_FALSE(out.has("general.architecture")) << patch;
  }
  // No layer slides: no window in the file (llama.cpp then builds its graph without one) and the
  // final soft-cap is written, which gguf_model.cpp reads back.
  test::TempDir dir("loom_gguf_gemma3_full");
  GgufWriter out;
  s = export_with({{"layer_types", {"full_attention", "full_attention"}}, {"final_logit_softcapping", 30.0}}, out);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(out.has("gemma3.attention.sliding_window"));
  EXPECT_TRUE(out.has("gemma3.final_logit_softcapping"));
  ASSERT_TRUE(out.write(dir.file("m.gguf")).ok());
  auto back = CausalLM::load(dir.file("m.gguf"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->get()->config().layer_is_sliding, (std::vector<bool>{false, false}));
  EXPECT_EQ(back->get()->config().final_logit_softcapping, 30.f);
}

// A Gemma3ForConditionalGeneration folder (transformers 5.x layout) is written as its language model
// alone, as convert_hf_to_gguf.py's Gemma3Model writes it (the vision tower is its mmproj file's):
// the same tensors, bytes and metadata as the text folder.
TEST(GgufExport, Gemma3MultimodalSourceWritesItsLanguageModel) {
  test::TempDir dir("loom_gguf_gemma3_mm");
  std::ifstream in(gemma3_dir(false) + "/config.json");
  const nlohmann::json text = nlohmann::json::parse(in);
  std::ofstream(dir.file("config.json"))
      << nlohmann::json({{"model_type", "gemma3"}, {"architectures", {"Gemma3ForConditionalGeneration"}},
                         {"text_config", text}, {"vision_config", {{"model_type", "siglip_vision_model"}}}})
             .dump();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, t] : test::read_all(gemma3_dir(false) + "/model.safetensors"))
    tensors.emplace_back("model.language_model." + name.substr(6), t);
  tensors.emplace_back("model.vision_tower.vision_model.embeddings.patch_embedding.weight",
                       Tensor::zeros({4, 3}, DType::f32, Device::cpu()));
  ASSERT_TRUE(save_tensors(dir.file("model.safetensors"), tensors).ok());
  auto write = [&](const std::string& model, const std::string& out) {
    auto m = CausalLM::load(model, {DType::f32, Device::cpu()});
    ASSERT_TRUE(m.ok()) << m.status();
    GgufWriter w;
    ASSERT_TRUE(add_gguf_model(**m, GgmlType::F16, "g", w).ok());
    ASSERT_TRUE(w.write(out).ok());
  };
  write(dir.path(), dir.file("mm.gguf"));
  write(gemma3_dir(false), dir.file("text.gguf"));
  auto mm = GgufFile::open(dir.file("mm.gguf")), txt = GgufFile::open(dir.file("text.gguf"));
  ASSERT_TRUE(mm.ok() && txt.ok());
  EXPECT_EQ(*mm->get_string("general.architecture"), "gemma3");
  ASSERT_EQ(mm->metadata().size(), txt->metadata().size());
  for (size_t i = 0; i < mm->metadata().size(); ++i) EXPECT_EQ(mm->metadata()[i].key, txt->metadata()[i].key);
  EXPECT_EQ(mm->get_int("gemma3.attention.sliding_window").value_or(0), 4);
  ASSERT_EQ(mm->tensors().size(), txt->tensors().size());
  for (const GgufTensorInfo& t : txt->tensors()) {
    const GgufTensorInfo* other = mm->find_tensor(t.name);
    ASSERT_NE(other, nullptr) << t.name;
    const auto a = mm->bytes(*other), b = txt->bytes(t);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << t.name;
  }
}

TEST(GgufWriter, WriteFailsCleanlyIntoAMissingFolder) {
  GgufWriter w;
  w.add("general.architecture", gguf_string("llama"));
  const absl::Status s = w.write("/nonexistent-dir/x.gguf");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("No such file or directory"), std::string_view::npos) << s;
}

}  // namespace
}  // namespace loom
