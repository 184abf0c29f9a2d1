// bitsandbytes 4-bit checkpoints: Nf4Weight against the CPU kernels, the quant_state JSON against
// Python's json.dumps, a write/read round trip, and every bad input naming its tensor and field.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "engine/safetensors.h"
#include "engine/tensor_io.h"
#include "kernels/dynamic_map.h"
#include "kernels/nf4.h"
#include "models/bnb_checkpoint.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/temp_dir.h"

namespace loom::test {
namespace {

const std::string kW = "model.layers.0.mlp.down_proj.weight";

Tensor random_weight(int64_t out, int64_t in, uint32_t seed) {
  return Tensor::from_floats(random_vec<float>(out * in, seed, -0.05f, 0.05f), {out, in});
}

TEST(Nf4Weight, QuantiseEqualsTheCpuKernelsAndDequantises) {
  const Tensor w = random_weight(96, 64 * 5 + 32, 1);  // 480 blocks: two nested blocks, one partial
  const Nf4Weight q = Nf4Weight::quantize(w);
  const int64_t n = w.numel(), blocks = nf4_blocks(n);
  std::vector<uint8_t> packed(nf4_packed_bytes(n)), qa(blocks);
  std::vector<float> absmax(blocks), nested(nf4_nested_blocks(n)), code(256);
  cpu::nf4_quantize(w.data<float>(), n, packed.data(), absmax.data());
  const float offset = cpu::nf4_absmax_mean(absmax.data(), blocks);
  dynamic_map(true, code.data());
  cpu::nf4_double_quantize(absmax.data(), blocks, offset, code.data(), qa.data(), nested.data());
  auto bytes = [](const Tensor& t) {
    const auto* p = static_cast<const uint8_t*>(t.data_ptr());
    return std::vector<uint8_t>(p, p + t.nbytes());
  };
  EXPECT_EQ(bytes(q.packed), packed);
  EXPECT_EQ(bytes(q.absmax), qa);
  EXPECT_EQ(q.nested_absmax.to_floats(), nested);
  EXPECT_EQ(q.nested_code.to_floats(), code);
  EXPECT_EQ(q.offset, offset);
  EXPECT_EQ(q.shape, (Shape{96, 352}));
  EXPECT_EQ(q.dtype, DType::f32);
  EXPECT_EQ(q.bytes(), int64_t(packed.size() + qa.size() + 4 * nested.size() + 4 * 256));

  std::vector<float> want(n);
  Nf4State st{nullptr, qa.data(), nested.data(), code.data(), offset};
  cpu::nf4_dequantize(packed.data(), st, n, want.data());
  EXPECT_EQ(q.dequantize(DType::f32).to_floats(), want);
  Tensor scratch = Tensor::empty({n}, DType::bf16);  // any shape with the right count
  q.dequantize_into(scratch);
  const auto b = scratch.to_floats();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b[i], bf16_to_float(float_to_bf16(want[i]))) << i;
  Tensor wrong = Tensor::empty({n + 1}, DType::f32);
  EXPECT_THROW(q.dequantize_into(wrong), Error);
}

// Expected strings from CPython 3.11: repr(struct.unpack('f', struct.pack('f', x))[0]).
TEST(BnbCheckpoint, PythonFloatRepr) {
  const std::pair<float, const char*> cases[] = {
      {0.0123f, "0.012299999594688416"}, {1e-5f, "9.999999747378752e-06"}, {0.00012345f, "0.0001234499941347167"},
      {3.0f, "3.0"}, {123456.789f, "123456.7890625"}, {1e16f, "1.0000000272564224e+16"},
      {2.5e-7f, "2.499999993688107e-07"}, {-0.04f, "-0.03999999910593033"}, {0.1f, "0.10000000149011612"},
      {1e-4f, "9.999999747378752e-05"}, {12345678901234567.f, "1.2345678407663616e+16"}, {0.f, "0.0"}};
  for (const auto& [x, want] : cases) EXPECT_EQ(python_float_repr(double(x)), want) << x;
}

TEST(BnbCheckpoint, QuantStateJsonIsBitsandbytesBytes) {
  Nf4Weight q = Nf4Weight::quantize(random_weight(64, 64, 2).to(DType::bf16));
  q.offset = 0.0123f;
  EXPECT_EQ(nf4_quant_state_json(q),
            "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [64, 64], "
            "\"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": 0.012299999594688416}");
}

// Writes the state of one weight (plus `edit`) as model_dir/model.safetensors.
std::string write_model(const TempDir& dir, const Nf4Weight& w,
                        const std::function<void(std::map<std::string, Tensor>&)>& edit = {}) {
  std::map<std::string, Tensor> t;
  for (auto& [name, tensor] : nf4_state_tensors(kW, w)) t[name] = tensor;
  if (edit) edit(t);
  std::vector<TensorToWrite> entries;
  for (auto& [name, x] : t)
    entries.push_back({name, x.dtype(), x.shape(),
                       std::span<const uint8_t>(static_cast<const uint8_t*>(x.data_ptr()), static_cast<size_t>(x.nbytes()))});
  EXPECT_TRUE(write_safetensors(dir.file("model.safetensors"), entries).ok());
  return dir.path();
}

Tensor json_bytes(const std::string& s) {
  Tensor b = Tensor::empty({static_cast<int64_t>(s.size())}, DType::u8);
  std::memcpy(b.data<uint8_t>(), s.data(), s.size());
  return b;
}

TEST(BnbCheckpoint, WriteAndLoadBack) {
  TempDir dir("loom_bnb");
  const Nf4Weight w = Nf4Weight::quantize(random_weight(40, 128, 3));
  auto ckpt = Checkpoint::open(write_model(dir, w));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const TensorInfo* packed = ckpt->find(kW);
  ASSERT_NE(packed, nullptr);
  EXPECT_EQ(packed->shape, (std::vector<int64_t>{40 * 64, 1}));
  EXPECT_TRUE(is_nf4(*ckpt, kW));
  EXPECT_FALSE(is_nf4(*ckpt, kW + ".absmax"));
  std::set<std::string> consumed = {kW};
  for (const auto& c : nf4_companion_names(kW)) consumed.insert(c);
  EXPECT_TRUE(ckpt->check_unexpected(consumed).ok()) << "the companions cover every tensor written";
  auto back = load_nf4(*ckpt, kW, {40, 128}, Device::cpu());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->offset, w.offset);
  EXPECT_EQ(back->shape, w.shape);
  EXPECT_EQ(back->dtype, DType::f32);
  EXPECT_EQ(back->dequantize(DType::f32).to_floats(), w.dequantize(DType::f32).to_floats());
}

void expect_load_error(const std::string& dir, const Shape& expected, const std::vector<std::string>& words) {
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto w = load_nf4(*ckpt, kW, expected, Device::cpu());
  ASSERT_FALSE(w.ok()) << "loaded but should not";
  const std::string msg(w.status().message());
  for (const auto& word : words) EXPECT_NE(msg.find(word), std::string::npos) << "message lacks '" << word << "': " << msg;
}

TEST(BnbCheckpoint, BadInputNamesTensorAndField) {
  const Nf4Weight w = Nf4Weight::quantize(random_weight(32, 64, 4));
  const std::string qs = kW + ".quant_state.bitsandbytes__nf4";
  auto with_json = [&](const std::string& from, const std::string& to) {
    std::string j = nf4_quant_state_json(w);
    const size_t at = j.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    j.replace(at, from.size(), to);
    return [=](std::map<std::string, Tensor>& t) { t[qs] = json_bytes(j); };
  };
  {
    TempDir d("loom_bnb");
    expect_load_error(write_model(d, w, [&](auto& t) { t.erase(qs); }), {32, 64}, {kW, qs, "missing"});
  }
  {
    TempDir d("loom_bnb");
    expect_load_error(write_model(d, w, [&](auto& t) { t.erase(kW + ".nested_absmax"); }), {32, 64},
                      {kW + ".nested_absmax", "missing"});
  }
  {
    TempDir d("loom_bnb");
    expect_load_error(write_model(d, w, [&](auto& t) { t[kW + ".absmax"] = Tensor::zeros({31}, DType::u8); }), {32, 64},
                      {kW + ".absmax", "[31]", "expected 32"});
  }
  {
    TempDir d("loom_bnb");
    expect_load_error(write_model(d, w, [&](auto& t) { t[kW + ".absmax"] = Tensor::zeros({32}, DType::f32); }), {32, 64},
                      {kW + ".absmax", "dtype f32", "expected u8"});
  }
  {
    TempDir d("loom_bnb");
    expect_load_error(write_model(d, w, with_json("\"blocksize\": 64", "\"blocksize\": 128")), {32, 64},
                      {qs, "'blocksize'", "128", "only 64"});
  }
  {
    TempDir d("loom_bnb");
    expect_load_error(write_model(d, w, with_json("\"quant_type\": \"nf4\"", "\"quant_type\": \"af4\"")), {32, 64},
                      {qs, "'quant_type'", "af4"});
  }
  {
    TempDir d("loom_bnb");
    expect_load_error(write_model(d, w, with_json("\"nested_blocksize\": 256", "\"nested_blocksize\": 128")), {32, 64},
                      {qs, "'nested_blocksize'", "128"});
  }
  {
    TempDir d("loom_bnb");
    expect_load_error(write_model(d, w), {64, 32}, {qs, "'shape'", "[32, 64]", "[64, 32]"});
  }
  {
    TempDir d("loom_bnb");
    expect_load_error(write_model(d, w, [&](auto& t) { t[qs] = json_bytes("{not json"); }), {32, 64}, {qs, "JSON"});
  }
  {
    TempDir d("loom_bnb");  // an fp4 weight: its quant state has the other suffix
    expect_load_error(write_model(d, w,
                                  [&](auto& t) {
                                    t[kW + ".quant_state.bitsandbytes__fp4"] = t[qs];
                                    t.erase(qs);
                                  }),
                      {32, 64}, {"fp4", "not supported"});
  }
  {
    TempDir d("loom_bnb");
    expect_load_error(write_model(d, w, [&](auto& t) { t[kW + ".quant_map"] = Tensor::zeros({16}, DType::f32); }),
                      {32, 64}, {kW + ".quant_map", "NF4"});
  }
}

nlohmann::json config_with(const nlohmann::json& q) {
  nlohmann::json c;
  c["model_type"] = "llama";
  c["quantization_config"] = q;
  return c;
}

TEST(BnbCheckpoint, QuantizationConfig) {
  BnbQuantConfig dflt;
  dflt.skip_modules = {"lm_head", "model.layers.1."};
  const nlohmann::json written = bnb_quant_config_json(dflt);
  EXPECT_EQ(written["quant_method"], "bitsandbytes");
  EXPECT_EQ(written["bnb_4bit_quant_type"], "nf4");
  EXPECT_EQ(written["bnb_4bit_use_double_quant"], true);
  EXPECT_EQ(written["load_in_4bit"], true);
  auto c = parse_bnb_quant_config(config_with(written), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->has_value());
  EXPECT_TRUE((*c)->double_quant);
  EXPECT_EQ((*c)->compute_dtype, "bfloat16");
  EXPECT_TRUE((*c)->skips("lm_head"));
  EXPECT_TRUE((*c)->skips("model.layers.1.mlp.up_proj"));
  EXPECT_FALSE((*c)->skips("model.layers.0.mlp.up_proj"));
  EXPECT_TRUE(bnb_quantizes("model.layers.0.mlp.up_proj.weight", c->operator->()));
  EXPECT_FALSE(bnb_quantizes("model.layers.1.mlp.up_proj.weight", c->operator->()));
  EXPECT_FALSE(bnb_quantizes("lm_head.weight"));
  EXPECT_FALSE(bnb_quantizes("model.embed_tokens.weight"));
  EXPECT_FALSE(bnb_quantizes("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_FALSE(bnb_quantizes("model.layers.0.input_layernorm.weight"));

  auto none = parse_bnb_quant_config(nlohmann::json{{"model_type", "llama"}}, "config.json");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  auto expect_bad = [](nlohmann::json q, const std::string& field, const std::string& word) {
    auto r = parse_bnb_quant_config(config_with(q), "m/config.json");
    ASSERT_FALSE(r.ok()) << field;
    const std::string msg(r.status().message());
    EXPECT_NE(msg.find("m/config.json: quantization_config." + field), std::string::npos) << msg;
    EXPECT_NE(msg.find(word), std::string::npos) << msg;
  };
  nlohmann::json q = written;
  q["bnb_4bit_quant_type"] = "fp4";
  expect_bad(q, "bnb_4bit_quant_type", "fp4");
  q = written;
  q["load_in_4bit"] = false;
  q["_load_in_4bit"] = false;
  q["load_in_8bit"] = true;
  expect_bad(q, "load_in_8bit", "8-bit");
  q = written;
  q["quant_method"] = "gptq";
  expect_bad(q, "quant_method", "gptq");
  q = written;
  q["bnb_4bit_quant_storage"] = "bfloat16";
  expect_bad(q, "bnb_4bit_quant_storage", "uint8");
  q = written;
  q["bnb_4bit_use_double_quant"] = "yes";
  expect_bad(q, "bnb_4bit_use_double_quant", "true or false");
}

}  // namespace
}  // namespace loom::test
