// The tiny families saved in 4 bits by transformers + bitsandbytes (tests/fixtures/bnb/models,
// made by tools/reference/make_bnb_model_reference.py on an H200) load in Loom as they are stored and give
// bitsandbytes' dequantised weights exactly, transformers' 4-bit logits and PEFT's LoRA loss and
// gradients on the 4-bit model (f32 compute on the CPU, as the references were made); QLoRA
// loading of the dense fixture is the same model. (`loom quantize` against bitsandbytes' bytes:
// tests/e2e/test_quantize.cpp.)
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "models/bnb_checkpoint.h"
#include "models/causal_lm.h"
#include "models/checkpoint.h"
#include "models/lora.h"
#include "nlohmann/json.hpp"
#include "tests/models/fixtures.h"

namespace loom::test {
namespace {

const std::vector<std::string> kFamilies = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gemma3"};

std::string bnb_dir(const std::string& family) {
  return std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/bnb/models/" + family;
}

class BnbFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(BnbFamily, DequantisedWeightsAreBitsandbytesExactly) {
  auto model = CausalLM::load(bnb_dir(GetParam()), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  auto ref = read_all(bnb_dir(GetParam()) + "/reference_4bit.safetensors");
  int quantized = 0;
  for (const Linear* l : (*model)->linears()) {
    if (!l->quantized()) continue;
    ++quantized;
    auto it = ref.find("dequant." + l->name + ".weight");
    ASSERT_NE(it, ref.end()) << l->name;
    EXPECT_EQ(rel_err(l->dense_weight(DType::f32), it->second), 0.0) << l->name;
  }
  // Seven projections a layer; phi3 keeps q, k, v and gate, up fused: four.
  const int per_layer = GetParam() == "phi3" ? 4 : 7;
  EXPECT_EQ(quantized, per_layer * (*model)->config().num_hidden_layers) << "every decoder projection is 4-bit";
}

TEST_P(BnbFamily, LogitsLoraLossAndGradientsMatchPeft) {
  auto model = CausalLM::load(bnb_dir(GetParam()), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  auto in = read_all(fixture_dir(GetParam()) + "/inputs.safetensors");
  auto ref = read_all(bnb_dir(GetParam()) + "/reference_4bit.safetensors");
  // f32 products over the same dequantised weights: the f32 family tolerances (tests/models/test_families.cpp).
  ag::Variable base = (*model)->forward(in["input_ids"]);
  EXPECT_LT(rel_err(base.value(), ref["logits"]), 2e-5) << "4-bit logits";
  ASSERT_TRUE(load_adapter(**model, fixture_dir(GetParam()) + "/adapter").ok());
  ag::Variable logits = (*model)->forward(in["input_ids"]);
  EXPECT_LT(rel_err(logits.value(), ref["lora_logits"]), 2e-5) << "4-bit + LoRA logits";
  ag::Variable loss = causal_lm_loss(logits, in["labels"]);
  EXPECT_LT(rel_err(loss.value(), ref["lora_loss"]), 1e-5) << "4-bit + LoRA loss";
  ag::backward(loss);
  int grads = 0;
  for (auto& [name, v] : lora_parameters(**model)) {
    auto it = ref.find("grad." + name);
    ASSERT_NE(it, ref.end()) << name;
    ASSERT_TRUE(v->grad().defined()) << name;
    EXPECT_LT(rel_err(v->grad(), it->second), 1e-4) << "grad of " << name;
    ++grads;
  }
  EXPECT_GT(grads, 0);
}

TEST_P(BnbFamily, QloraLoadingOfTheDenseFixtureIsTheStoredModel) {
  LoadOptions opt{DType::f32, Device::cpu()};
  opt.quantize_4bit = true;
  auto quantized = CausalLM::load(fixture_dir(GetParam()), opt);
  ASSERT_TRUE(quantized.ok()) << quantized.status();
  auto in = read_all(fixture_dir(GetParam()) + "/inputs.safetensors");
  auto ref = read_all(bnb_dir(GetParam()) + "/reference_4bit.safetensors");
  EXPECT_LT(rel_err((*quantized)->forward(in["input_ids"]).value(), ref["logits"]), 2e-5);
}

TEST_P(BnbFamily, MergeDequantisesIntoADenseModel) {
  auto model = CausalLM::load(bnb_dir(GetParam()), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(load_adapter(**model, fixture_dir(GetParam()) + "/adapter").ok());
  auto in = read_all(fixture_dir(GetParam()) + "/inputs.safetensors");
  const Tensor adapted = (*model)->forward(in["input_ids"]).value();
  merge_lora(**model);
  for (const Linear* l : (*model)->linears()) EXPECT_FALSE(l->quantized() || l->lora) << l->name;
  // The merged weights are B A added to bitsandbytes' dequantised values: the adapted logits again.
  EXPECT_LT(rel_err((*model)->forward(in["input_ids"]).value(), adapted), 1e-5);
  const std::string out = ::testing::TempDir() + "loom_bnb_merged_" + GetParam() + "_" + std::to_string(getpid());
  ASSERT_TRUE(save_pretrained(**model, out).ok());
  std::ifstream cf(out + "/config.json");
  const auto config = nlohmann::json::parse(cf);
  EXPECT_FALSE(config.contains("quantization_config")) << "a dense model must not claim to be 4-bit";
  std::filesystem::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BnbFamily, ::testing::ValuesIn(kFamilies),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace loom::test
