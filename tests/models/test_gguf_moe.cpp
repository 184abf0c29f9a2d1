// GGUF export and import of the mixture-of-experts families (tools/reference/moe_formats.md (e), from
// llama.cpp's convert_hf_to_gguf.py, gguf-py and src/models/{llama,qwen3moe}.cpp): Mixtral as `llama`
// with llama.expert_count, Qwen3-MoE as `qwen3moe`; the router as ffn_gate_inp (F32), the experts
// stacked as ffn_gate_exps / ffn_up_exps / ffn_down_exps with ggml's reversed dims. The file's names,
// ne, types and keys are checked against that note, its expert values against the fixture's own
// per-expert tensors; read back, the model gives the source's logits (Mixtral: transformers' too) and
// gguf_hf_tensors gives back the fixture's checkpoint, name for name and bit for bit. What llama.cpp's
// qwen3moe cannot hold (norm_topk_prob false, dense layers) is refused before anything is written.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "engine/gguf_writer.h"
#include "kernels/common.h"
#include "models/causal_lm.h"
#include "models/gguf_export.h"
#include "models/gguf_model.h"
#include "models/nf4_weight.h"
#include "nlohmann/json.hpp"
#include "tests/models/fixtures.h"
#include "tests/temp_dir.h"

namespace loom {
namespace {
using test::fixture_dir;
using test::read_all;

// The qwen3_moe fixture with norm_topk_prob true (as the released Qwen3-MoE models), which
// llama.cpp's qwen3moe computes; the fixture itself says false.
const std::string& qwen3_moe_renormalised() {
  static const test::TempDir dir("loom_gguf_qwen3_moe");
  static const bool made = [] {
    test::copy_fixture("qwen3_moe", dir.path(), {{"norm_topk_prob", true}});
    return true;
  }();
  (void)made;
  return dir.path();
}

struct Case {
  std::string source, fixture, arch;  // the model folder, the fixture its weights are, the GGUF arch
  int64_t ff, expert_ff;              // <arch>.feed_forward_length, the experts' width
};
std::vector<Case> cases() {
  return {{fixture_dir("mixtral"), "mixtral", "llama", 48, 48}, {qwen3_moe_renormalised(), "qwen3_moe", "qwen3moe", 96, 48}};
}

std::unique_ptr<CausalLM> load(const std::string& path) {
  auto m = CausalLM::load(path, {DType::f32, Device::cpu()});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

void write_gguf(const CausalLM& m, GgmlType type, const std::string& path) {
  GgufWriter w;
  const absl::Status s = add_gguf_model(m, type, "moe", w);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(w.write(path).ok());
}

// Every matrix and expert stack rounded in place as the file stores it: F16, or Q8_0 blocks of 32
// along rows (d = max|x| / 127 as f16, q = round(x / d); ggml's quantize_row_q8_0_ref) where rows are
// whole blocks, else F16; the router stays f32.
void round_as_the_file(CausalLM& m, GgmlType type) {
  for (auto& [name, v] : m.named_weights()) {
    if (v->value().dim() < 2 || name.ends_with(".mlp.gate.weight")) continue;
    float* p = v->value().data<float>();
    const int64_t n = v->value().numel();
    if (type == GgmlType::Q8_0 && v->value().size(-1) % 32 == 0) {
      for (int64_t b = 0; b < n; b += 32) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(p[b + j]));
        const float d = amax / 127.f, id = d != 0 ? 1.f / d : 0.f, d16 = fp16_to_f32(f32_to_fp16(d));
        for (int j = 0; j < 32; ++j) p[b + j] = std::round(p[b + j] * id) * d16;
      }
      continue;
    }
    for (int64_t i = 0; i < n; ++i) p[i] = fp16_to_f32(f32_to_fp16(p[i]));
  }
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

TEST(GgufMoe, NamesShapesTypesAndKeysAreLlamaCpps) {
  test::TempDir dir;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.source);
    auto m = load(c.source);
    ASSERT_TRUE(m);
    ASSERT_NO_FATAL_FAILURE(write_gguf(*m, GgmlType::F16, dir.file("m.gguf")));
    auto f = GgufFile::open(dir.file("m.gguf"));
    ASSERT_TRUE(f.ok()) << f.status();
    const std::string p = c.arch + ".";
    EXPECT_EQ(f->get_string("general.architecture").value_or(""), c.arch);
    EXPECT_EQ(f->get_int(p + "expert_count").value_or(0), 4);
    EXPECT_EQ(f->get_int(p + "expert_used_count").value_or(0), 2);
    EXPECT_EQ(f->get_int(p + "feed_forward_length").value_or(0), c.ff);
    // Mixtral: llama.cpp's llama reads the experts' width from feed_forward_length; no key of its own.
    EXPECT_EQ(f->has(p + "expert_feed_forward_length"), c.arch == "qwen3moe");
    if (c.arch == "qwen3moe") {
      EXPECT_EQ(f->get_int(p + "expert_feed_forward_length").value_or(0), c.expert_ff);
    }
    EXPECT_FALSE(f->has(p + "expert_weights_norm"));  // convert_hf_to_gguf.py writes none for these
    const int64_t H = 64, I = c.expert_ff, E = 4;
    const auto src = read_all(fixture_dir(c.fixture) + "/model.safetensors");
    const std::string experts = c.arch == "llama" ? "block_sparse_moe.experts." : "mlp.experts.";
    const std::vector<std::string> parts =
        c.arch == "llama" ? std::vector<std::string>{"w1", "w3", "w2"} : std::vector<std::string>{"gate_proj", "up_proj", "down_proj"};
    for (int layer = 0; layer < 2; ++layer) {
      const std::string blk = "blk." + std::to_string(layer) + ".";
      const GgufTensorInfo* router = f->find_tensor(blk + "ffn_gate_inp.weight");
      ASSERT_NE(router, nullptr);
      EXPECT_EQ(router->ne, (std::vector<int64_t>{H, E}));
      EXPECT_EQ(router->type, GgmlType::F32);  // convert_hf_to_gguf.py keeps FFN_GATE_INP in F32
      const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
          {"ffn_gate_exps", {H, I, E}}, {"ffn_up_exps", {H, I, E}}, {"ffn_down_exps", {I, H, E}}};
      for (size_t k = 0; k < want.size(); ++k) {
        const GgufTensorInfo* t = f->find_tensor(blk + want[k].first + ".weight");
        ASSERT_NE(t, nullptr) << want[k].first;
        EXPECT_EQ(t->ne, want[k].second) << want[k].first;
        EXPECT_EQ(t->type, GgmlType::F16) << want[k].first;
        // Expert e's slice is the fixture's own per-expert matrix, rounded to f16.
        auto v = f->read_f32(*t);
        ASSERT_TRUE(v.ok()) << v.status();
        for (int64_t e = 0; e < E; ++e) {
          const std::string name = "model.layers." + std::to_string(layer) + "." + experts + std::to_string(e) + "." +
                                   parts[k] + ".weight";
          const auto want_v = src.at(name).to_floats();
          const auto got = v->narrow(0, e, 1).contiguous().to_floats();
          ASSERT_EQ(got.size(), want_v.size()) << name;
          for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], fp16_to_f32(f32_to_fp16(want_v[i]))) << name << " " << i;
        }
      }
      for (const char* dense : {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})
        EXPECT_EQ(f->find_tensor(blk + dense), nullptr) << dense;
    }
    // Per layer: 2 norms, q, k, v, o, the router, 3 expert stacks (+ q/k norms for qwen3moe); embeddings,
    // the final norm and output.
    EXPECT_EQ(f->tensors().size(), static_cast<size_t>(2 * (c.arch == "llama" ? 10 : 12) + 3));
  }
}

// Written in f32 and read back: the same config (as llama.cpp computes it) and tensors, so the
// same logits; Mixtral's against transformers' as well. F16 then Q8_0 as the file rounds them (the
// router stays f32).
TEST(GgufMoe, RoundTripGivesTheSourceModel) {
  test::TempDir dir;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.source);
    auto src = load(c.source);
    ASSERT_TRUE(src);
    ASSERT_NO_FATAL_FAILURE(write_gguf(*src, GgmlType::F32, dir.file("m.gguf")));
    auto back = load(dir.file("m.gguf"));
    ASSERT_TRUE(back);
    const ModelConfig &a = src->config(), &b = back->config();
    EXPECT_EQ(b.family, a.family);
    EXPECT_EQ(b.moe.experts, a.moe.experts);
    EXPECT_EQ(b.moe.experts_per_token, a.moe.experts_per_token);
    EXPECT_EQ(b.moe.expert_intermediate, a.moe.expert_intermediate);
    EXPECT_EQ(b.intermediate_size, a.intermediate_size);
    EXPECT_TRUE(b.moe.renormalize);
    EXPECT_EQ(b.moe.layer_is_moe, a.moe.layer_is_moe);
    EXPECT_EQ(b.head_dim, a.head_dim);
    const auto in = read_all(fixture_dir(c.fixture) + "/inputs.safetensors");
    const Tensor& ids = in.at("input_ids");
    const auto want = src->forward(ids).value().to_floats(), got = back->forward(ids).value().to_floats();
    EXPECT_LE(max_abs_diff(got, want), 1e-5f);  // only rms eps and the RoPE base pass through f32 metadata
    if (c.fixture == "mixtral") {
      EXPECT_LT(test::rel_err(back->forward(ids).value(), read_all(fixture_dir("mixtral") + "/reference.safetensors")["logits"]),
                2e-5);
    }
    // The hub checkpoint back from the file: the fixture's names, values exact (f32; q/k unpermuted).
    auto f = GgufFile::open(dir.file("m.gguf"));
    ASSERT_TRUE(f.ok());
    auto tensors = gguf_hf_tensors(*f, b);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    const auto fixture = read_all(fixture_dir(c.fixture) + "/model.safetensors");
    EXPECT_EQ(tensors->size(), fixture.size());
    for (const auto& [name, t] : fixture) {
      auto it = tensors->find(name);
      ASSERT_NE(it, tensors->end()) << name;
      EXPECT_EQ(it->second.shape(), t.shape()) << name;
      EXPECT_EQ(it->second.contiguous().to_floats(), t.to_floats()) << name;
    }

    for (GgmlType type : {GgmlType::F16, GgmlType::Q8_0}) {
      SCOPED_TRACE(ggml_type_name(type));
      auto rounded_src = load(c.source);
      ASSERT_TRUE(rounded_src);
      ASSERT_NO_FATAL_FAILURE(write_gguf(*rounded_src, type, dir.file("r.gguf")));
      auto from_file = load(dir.file("r.gguf"));
      ASSERT_TRUE(from_file);
      round_as_the_file(*rounded_src, type);
      const auto r = from_file->forward(ids).value().to_floats();
      EXPECT_LE(max_abs_diff(r, rounded_src->forward(ids).value().to_floats()), 1e-5f);
      EXPECT_GT(max_abs_diff(r, want), 0.f);  // the file was rounded for real
    }
  }
}

// What llama.cpp's qwen3moe would compute differently is refused before anything is written, naming
// the config field.
TEST(GgufMoe, Qwen3MoeRefusesWhatLlamaCppCannotHold) {
  auto as_is = load(fixture_dir("qwen3_moe"));  // norm_topk_prob false
  ASSERT_TRUE(as_is);
  GgufWriter w;
  absl::Status s = add_gguf_model(*as_is, GgmlType::F16, "x", w);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("norm_topk_prob is false"), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("always divides"), std::string_view::npos) << s;
  EXPECT_FALSE(w.has("general.architecture"));

  auto sparse = load(fixture_dir("qwen3_moe_sparse"));  // decoder_sparse_step 2, mlp_only_layers [3]
  ASSERT_TRUE(sparse);
  GgufWriter w2;
  s = add_gguf_model(*sparse, GgmlType::F16, "x", w2);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("mlp_only_layers / decoder_sparse_step make layers 0, 2, 3 dense"), std::string_view::npos)
      << s;
  EXPECT_NE(s.message().find("every layer as a mixture of experts"), std::string_view::npos) << s;
  EXPECT_FALSE(w2.has("general.architecture"));
}

// 4-bit experts (QLoRA) have no dense tensor to write: refused, not left out of the file.
TEST(GgufMoe, RefusesFourBitExperts) {
  auto m = load(fixture_dir("mixtral"));
  ASSERT_TRUE(m);
  ExpertLinear& x = *m->expert_linears().at(0);
  for (int64_t e = 0; e < x.experts; ++e)
    x.nf4.push_back(std::make_shared<const Nf4Weight>(
        Nf4Weight::quantize(x.weight.value().narrow(0, e, 1).reshape({x.out, x.in}).contiguous())));
  x.weight = ag::Variable();
  GgufWriter w;
  const absl::Status s = add_gguf_model(*m, GgmlType::F16, "x", w);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(x.name + " is 4-bit (NF4)"), std::string_view::npos) << s;
  EXPECT_FALSE(w.has("general.architecture"));
}

// The family comes from general.architecture and <arch>.expert_count together: a `llama` file with
// experts is Mixtral; a qwen3moe file without them, or a qwen3 file with them, is an error naming the key.
TEST(GgufMoe, ExpertCountPicksTheFamily) {
  test::TempDir dir;
  auto config_of = [&](const std::string& arch, int64_t experts) {
    GgufWriter w;
    w.add("general.architecture", gguf_string(arch));
    const std::string p = arch + ".";
    w.add(p + "block_count", gguf_u32(1));
    w.add(p + "embedding_length", gguf_u32(8));
    w.add(p + "feed_forward_length", gguf_u32(16));
    w.add(p + "attention.head_count", gguf_u32(2));
    if (experts > 0) {
      w.add(p + "expert_count", gguf_u32(static_cast<uint32_t>(experts)));
      w.add(p + "expert_used_count", gguf_u32(2));
      w.add(p + "expert_feed_forward_length", gguf_u32(12));
    }
    w.add_tensor("token_embd.weight", Tensor::zeros({32, 8}, DType::f32, Device::cpu()), GgmlType::F32);
    EXPECT_TRUE(w.write(dir.file("c.gguf")).ok());
    auto f = GgufFile::open(dir.file("c.gguf"));
    EXPECT_TRUE(f.ok()) << f.status();
    return gguf_hf_config(*f);
  };
  auto mixtral = config_of("llama", 4);
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ((*mixtral)["model_type"], "mixtral");
  EXPECT_EQ((*mixtral)["architectures"], nlohmann::json::array({"MixtralForCausalLM"}));
  EXPECT_EQ((*mixtral)["num_local_experts"], 4);
  EXPECT_EQ((*mixtral)["num_experts_per_tok"], 2);
  EXPECT_EQ((*mixtral)["intermediate_size"], 16);  // the experts' width in llama.cpp's llama
  auto llama = config_of("llama", 0);
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ((*llama)["model_type"], "llama");
  auto qwen = config_of("qwen3moe", 4);
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ((*qwen)["model_type"], "qwen3_moe");
  EXPECT_EQ((*qwen)["architectures"], nlohmann::json::array({"Qwen3MoeForCausalLM"}));
  EXPECT_EQ((*qwen)["num_experts"], 4);
  EXPECT_EQ((*qwen)["moe_intermediate_size"], 12);
  EXPECT_EQ((*qwen)["intermediate_size"], 16);
  EXPECT_EQ((*qwen)["norm_topk_prob"], true);  // llama.cpp always renormalises
  EXPECT_EQ((*qwen)["decoder_sparse_step"], 1);
  EXPECT_EQ((*qwen)["mlp_only_layers"], nlohmann::json::array());
  auto c = ModelConfig::from_json_text(qwen->dump(), "qwen3moe metadata");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->moe.renormalize);
  EXPECT_EQ(c->moe.layer_is_moe, std::vector<bool>{true});
  auto no_experts = config_of("qwen3moe", 0);
  EXPECT_EQ(no_experts.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(no_experts.status().message().find("no qwen3moe.expert_count above 0"), std::string_view::npos)
      << no_experts.status();
  auto dense_with_experts = config_of("qwen3", 4);
  EXPECT_EQ(dense_with_experts.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(dense_with_experts.status().message().find("qwen3.expert_count is 4"), std::string_view::npos)
      << dense_with_experts.status();
}

}  // namespace
}  // namespace loom
