// `loom quantize`: the tiny fixture models written as bitsandbytes 4-bit checkpoints: every decoder
// Linear weight's bytes equal the CPU reference quantiser's, every other tensor is copied byte for
// byte, config.json carries transformers' quantization_config, the tokenizer files come along,
// and the result loads back through load_nf4. Bad flags and inputs fail with a clear message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/safetensors.h"
#include "engine/tensor_io.h"
#include "kernels/dynamic_map.h"
#include "kernels/nf4.h"
#include "models/bnb_checkpoint.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cli.h"
#include "tests/temp_dir.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

const std::string kModels = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/models/";

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

void check_quantized(const std::string& src_dir, const std::string& out, const char* torch_dtype) {
  auto src = Checkpoint::open(src_dir);
  auto dst = Checkpoint::open(out);
  ASSERT_TRUE(src.ok() && dst.ok());
  std::vector<float> code(256);
  dynamic_map(true, code.data());
  int quantized = 0;
  for (const std::string& name : src->names()) {
    const TensorInfo* info = src->find(name);
    if (!bnb_quantizes(name)) {  // copied as is
      const TensorInfo* o = dst->find(name);
      ASSERT_NE(o, nullptr) << name;
      EXPECT_EQ(o->dtype, info->dtype) << name;
      EXPECT_EQ(bytes_of(*dst->load(name, info->dtype == DType::bf16 ? DType::bf16 : DType::f32, Device::cpu())),
                bytes_of(*src->load(name, info->dtype == DType::bf16 ? DType::bf16 : DType::f32, Device::cpu())))
          << name;
      continue;
    }
    ++quantized;
    ASSERT_TRUE(is_nf4(*dst, name)) << name;
    // The CPU reference quantiser on the source weight, in its own dtype.
    const Tensor w = *src->load(name, info->dtype == DType::bf16 ? DType::bf16 : DType::f32, Device::cpu());
    const int64_t n = w.numel(), blocks = nf4_blocks(n);
    std::vector<uint8_t> packed(nf4_packed_bytes(n)), qa(blocks);
    std::vector<float> absmax(blocks), nested(nf4_nested_blocks(n));
    if (w.dtype() == DType::bf16) cpu::nf4_quantize(w.data<bf16>(), n, packed.data(), absmax.data());
    else cpu::nf4_quantize(w.data<float>(), n, packed.data(), absmax.data());
    const float offset = cpu::nf4_absmax_mean(absmax.data(), blocks);
    cpu::nf4_double_quantize(absmax.data(), blocks, offset, code.data(), qa.data(), nested.data());

    EXPECT_EQ(dst->find(name)->shape, (std::vector<int64_t>{n / 2, 1})) << name;
    EXPECT_EQ(bytes_of(*dst->load(name, DType::u8, Device::cpu())), packed) << name;
    EXPECT_EQ(bytes_of(*dst->load(name + ".absmax", DType::u8, Device::cpu())), qa) << name;
    EXPECT_EQ(dst->load(name + ".nested_absmax", DType::f32, Device::cpu())->to_floats(), nested) << name;
    EXPECT_EQ(dst->load(name + ".nested_quant_map", DType::f32, Device::cpu())->to_floats(), code) << name;
    EXPECT_EQ(dst->load(name + ".quant_map", DType::f32, Device::cpu())->to_floats(),
              std::vector<float>(kNf4Code, kNf4Code + 16))
        << name;
    const auto qs = bytes_of(*dst->load(name + ".quant_state.bitsandbytes__nf4", DType::u8, Device::cpu()));
    const std::string json(qs.begin(), qs.end());
    const std::string head = std::string("{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"") + torch_dtype +
                             "\", \"shape\": [" + std::to_string(w.size(0)) + ", " + std::to_string(w.size(1)) +
                             "], \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": ";
    EXPECT_EQ(json.substr(0, head.size()), head) << json;
    EXPECT_EQ(static_cast<float>(nlohmann::json::parse(json)["nested_offset"].get<double>()), offset) << json;

    auto back = load_nf4(*dst, name, w.shape(), Device::cpu());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->offset, offset);
  }
  EXPECT_EQ(quantized, 14) << "2 layers x q/k/v/o/gate/up/down";
}

TEST(Quantize, F32FixtureGivesTheReferenceBytes) {
  test::TempDir dir("loom_quantize");
  const std::string out = dir.file("q");
  auto r = test::run_loom("quantize --model " + kModels + "llama --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("14 weights"), std::string::npos) << r.output;
  check_quantized(kModels + "llama", out, "float32");
  std::ifstream cf(out + "/config.json");
  const auto config = nlohmann::json::parse(cf);
  const auto& q = config.at("quantization_config");
  EXPECT_EQ(q.at("quant_method"), "bitsandbytes");
  EXPECT_EQ(q.at("load_in_4bit"), true);
  EXPECT_EQ(q.at("bnb_4bit_quant_type"), "nf4");
  EXPECT_EQ(q.at("bnb_4bit_use_double_quant"), true);
  EXPECT_EQ(q.at("bnb_4bit_compute_dtype"), "bfloat16");
  EXPECT_EQ(config.at("hidden_size"), 64);  // the rest of the config kept
  EXPECT_TRUE(fs::exists(out + "/generation_config.json"));
  auto parsed = read_bnb_quant_config(out);
  ASSERT_TRUE(parsed.ok() && parsed->has_value()) << parsed.status();
  for (const auto& e : fs::directory_iterator(dir.path()))  // nothing left under a temporary name
    EXPECT_EQ(e.path().filename().string(), "q");
}

TEST(Quantize, AFolderWhereConfigJsonBelongsIsAClearError) {
  test::TempDir dir("loom_quantize");
  fs::create_directories(dir.file("model/config.json"));
  auto r = test::run_loom("quantize --model " + dir.file("model") + " --out " + dir.file("q"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(dir.file("model/config.json") + ": cannot open: Is a directory"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir.file("q")));
}

TEST(Quantize, ShardedBf16FixtureKeepsBf16) {
  test::TempDir dir("loom_quantize");
  const std::string out = dir.file("q");
  auto r = test::run_loom("quantize --model " + kModels + "llama_tied_bf16 --out " + out + " --compute-dtype float16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  check_quantized(kModels + "llama_tied_bf16", out, "bfloat16");
  std::ifstream cf(out + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(cf)["quantization_config"]["bnb_4bit_compute_dtype"], "float16");
}

// Against what transformers + bitsandbytes saved for the same f32 fixture on an H200
// (tests/fixtures/bnb/models/<family>/, tools/reference/make_bnb_model_reference.py; skipped while absent).
// Dense tensors and the absmax are bit-equal. Codes may differ only where bitsandbytes' fast-math
// reciprocal (within 1 ulp) moves x / absmax across a decision threshold (the kernel test checks
// that argument element by element); the offset is a mean summed in another order: within 4 ulps.
// With bitsandbytes' own offset, the double-quantised absmax is bit-equal.
TEST(Quantize, MatchesTransformersBitsandbytes) {
  const std::string bnb_dir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/bnb/models/";
  int checked = 0;
  std::vector<float> code(256);
  dynamic_map(true, code.data());
  for (const char* family : {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2"}) {
    if (!fs::exists(bnb_dir + family + "/model.safetensors")) continue;
    ++checked;
    test::TempDir dir("loom_quantize");
    const std::string out = dir.file("q");
    auto r = test::run_loom("quantize --model " + kModels + family + " --out " + out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto ours = Checkpoint::open(out);
    auto theirs = Checkpoint::open(bnb_dir + family);
    ASSERT_TRUE(ours.ok() && theirs.ok()) << family;
    EXPECT_EQ(ours->names(), theirs->names()) << family;
    for (const std::string& name : theirs->names()) {
      const TensorInfo* t = theirs->find(name);
      const TensorInfo* o = ours->find(name);
      if (!o) continue;  // reported by the names check
      EXPECT_EQ(o->dtype, t->dtype) << family << " " << name;
      // The quant_state JSON's length follows nested_offset's digits, which may differ in the last
      // place (torch's CUDA mean): its fields are compared through load_nf4 below.
      if (name.ends_with(".quant_state.bitsandbytes__nf4")) continue;
      EXPECT_EQ(o->shape, t->shape) << family << " " << name;
      // Dense tensors here; the 4-bit weights and their companions per weight below.
      if (!is_nf4(*theirs, name) && name.find(".weight.") == std::string::npos) {
        const DType as = t->dtype == DType::bf16 ? DType::bf16 : (is_float(t->dtype) ? DType::f32 : t->dtype);
        EXPECT_EQ(bytes_of(*ours->load(name, as, Device::cpu())), bytes_of(*theirs->load(name, as, Device::cpu())))
            << family << " " << name;
      }
    }
    for (const std::string& name : theirs->names()) {
      if (!is_nf4(*theirs, name)) continue;
      auto a = load_nf4(*ours, name, {}, Device::cpu());
      auto b = load_nf4(*theirs, name, {}, Device::cpu());
      ASSERT_TRUE(a.ok() && b.ok()) << family << " " << name;
      EXPECT_EQ(a->shape, b->shape);
      EXPECT_EQ(a->dtype, b->dtype);
      EXPECT_LE(std::abs(a->offset - b->offset), 4 * (std::nextafter(b->offset, INFINITY) - b->offset))
          << family << " " << name << " offset " << a->offset << " vs " << b->offset;
      // The f32 absmax, and the codes, from the source weight with the reference kernel.
      const Tensor w = *Checkpoint::open(kModels + family)->load(name, DType::f32, Device::cpu());
      const int64_t n = w.numel(), blocks = nf4_blocks(n);
      std::vector<uint8_t> packed(nf4_packed_bytes(n)), qa(blocks);
      std::vector<float> absmax(blocks), nested(nf4_nested_blocks(n));
      cpu::nf4_quantize(w.data<float>(), n, packed.data(), absmax.data());
      cpu::nf4_double_quantize(absmax.data(), blocks, b->offset, code.data(), qa.data(), nested.data());
      EXPECT_EQ(bytes_of(b->absmax), qa) << family << " " << name;
      EXPECT_EQ(b->nested_absmax.to_floats(), nested) << family << " " << name;
      const auto want = bytes_of(b->packed), got = bytes_of(a->packed);
      for (int64_t i = 0; i < n; ++i) {
        const int shift = (i & 1) ? 0 : 4;
        const int gc = (got[i / 2] >> shift) & 15, wc = (want[i / 2] >> shift) & 15;
        if (gc == wc) continue;
        const float inv = 1.0f / absmax[i / kNf4Block], v = w.data<float>()[i];
        EXPECT_TRUE(nf4_code_of(v * std::nextafter(inv, 0.f)) == wc || nf4_code_of(v * std::nextafter(inv, INFINITY)) == wc)
            << family << " " << name << " element " << i;
      }
    }
  }
  if (checked == 0)
    GTEST_SKIP() << bnb_dir << " is absent: run tools/reference/make_bnb_model_reference.py on the GPU machine";
}

TEST(Quantize, Errors) {
  test::TempDir dir("loom_quantize");
  auto r = test::run_loom("quantize --out " + dir.file("x"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--model is required"), std::string::npos) << r.output;
  r = test::run_loom("quantize --model " + kModels + "nope --out " + dir.file("x"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("nope"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir.file("x")));
  r = test::run_loom("quantize --model " + kModels + "llama --out " + dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("already exists"), std::string::npos) << r.output;
  r = test::run_loom("quantize --model " + kModels + "llama --out " + dir.file("q") + " --compute-dtype int8");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--compute-dtype int8"), std::string::npos) << r.output;
  ASSERT_EQ(test::run_loom("quantize --model " + kModels + "llama --out " + dir.file("q")).exit_code, 0);
  r = test::run_loom("quantize --model " + dir.file("q") + " --out " + dir.file("q2"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("already quantised"), std::string::npos) << r.output;
  // A weight holding inf is refused naming it (it used to give an infinite nested offset that no
  // loader accepts, and exit 0).
  fs::copy(kModels + "llama", dir.file("inf"), fs::copy_options::recursive);
  auto tensors = load_tensors(dir.file("inf") + "/model.safetensors");
  ASSERT_TRUE(tensors.ok());
  std::vector<std::pair<std::string, Tensor>> edited;
  for (auto& [name, t] : *tensors) {
    Tensor c = t.to(DType::f32).contiguous();
    if (name == "model.layers.0.mlp.up_proj.weight") c.data<float>()[3] = INFINITY;
    edited.emplace_back(name, c);
  }
  ASSERT_TRUE(save_tensors(dir.file("inf") + "/model.safetensors", edited, DType::f32).ok());
  r = test::run_loom("quantize --model " + dir.file("inf") + " --out " + dir.file("qinf"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("tensor 'model.layers.0.mlp.up_proj.weight' holds inf at [0, 3]"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir.file("qinf")));
}

}  // namespace
}  // namespace loom
