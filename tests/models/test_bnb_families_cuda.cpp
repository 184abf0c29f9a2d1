// The bitsandbytes 4-bit fixtures on CUDA (f32 compute): the NF4 dequantisation kernels and the
// frozen / LoRA linears that re-dequantise in backward give transformers' 4-bit logits and PEFT's
// gradients, as on the CPU (tests/models/test_bnb_families.cpp).
#include "models/causal_lm.h"
#include "models/lora.h"
#include "tests/models/fixtures.h"

namespace loom::test {
namespace {

class BnbFamilyCuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(BnbFamilyCuda, LogitsAndLoraGradientsMatchPeft) {
  const std::string dir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/bnb/models/" + GetParam();
  auto model = CausalLM::load(dir, {DType::f32, Device::cuda(0)});
  ASSERT_TRUE(model.ok()) << model.status();
  auto in = read_all(fixture_dir(GetParam()) + "/inputs.safetensors");
  auto ref = read_all(dir + "/reference_4bit.safetensors");
  EXPECT_LT(rel_err((*model)->forward(in["input_ids"]).value(), ref["logits"]), 1e-4);
  ASSERT_TRUE(load_adapter(**model, fixture_dir(GetParam()) + "/adapter").ok());
  ag::Variable logits = (*model)->forward(in["input_ids"]);
  EXPECT_LT(rel_err(logits.value(), ref["lora_logits"]), 1e-4);
  ag::Variable loss = causal_lm_loss(logits, in["labels"]);
  ag::backward(loss);
  for (auto& [name, v] : lora_parameters(**model)) {
    ASSERT_TRUE(v->grad().defined()) << name;
    EXPECT_LT(rel_err(v->grad(), ref["grad." + name]), 1e-4) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BnbFamilyCuda,
                         ::testing::Values("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace loom::test
