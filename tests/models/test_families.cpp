// Every family against transformers and PEFT on the CPU in f32: logits and loss of the base
// model, logits/loss/LoRA gradients with a PEFT adapter, the weights after one AdamW step, and
// the merged model. References: tests/fixtures/models (tools/reference/make_reference.py).
#include <filesystem>

#include "tests/models/family_checks.h"

namespace loom::test {
namespace {

// f32 on both sides; only summation order differs (GEMM blocking, softmax): ~1e-6 relative.
// Gradients pass through ~10 ops of the two-layer model: 1e-4 leaves room for that while a wrong
// formula is O(1). The AdamW step divides by sqrt(v) ~ |g|, which amplifies gradient error on the
// first step to lr-sized absolute error: 1e-4 relative on the weights.
constexpr Tolerances kF32{2e-5, 1e-5, 1e-4, 1e-4};

class Family : public ::testing::TestWithParam<std::string> {};

TEST_P(Family, BaseLogitsAndLossMatchTransformers) {
  check_base_logits(GetParam(), {DType::f32, Device::cpu()}, kF32);
}

TEST_P(Family, LoraLogitsGradientsAndStepMatchPeft) { check_lora(GetParam(), {DType::f32, Device::cpu()}, kF32); }

// bf16 on the CPU (the same bf16 storage and f32 accumulation as CUDA): LoRA gradients within
// twice PyTorch's own bf16 error, so CI sees a precision regression of the adapter path.
TEST_P(Family, LoraBf16WithinTorchsBf16Error) {
  check_lora(GetParam(), {DType::bf16, Device::cpu()}, Tolerances{0, 0, 0, 0, true});
}

// Loaded with room for the adapters (LoadOptions::adapter_room, what `loom train` asks for LoRA in
// bf16): the norm readers' weights are already wide, attaching the adapter moves nothing, and the
// product matches PyTorch's bf16 error as above.
TEST_P(Family, LoraBf16WithRoomAtLoad) {
  LoadOptions opt{DType::bf16, Device::cpu()};
  opt.adapter_room = 3 * 64 + 1;  // more than any fixture adapter's 3 r + 1
  auto model = CausalLM::load(fixture_dir(GetParam()), opt);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<const void*> before;
  for (const Linear* l : (**model).norm_readers()) {
    EXPECT_GE(l->weight_spare, opt.adapter_room) << l->name;
    before.push_back(l->weight.value().data_ptr());
  }
  ASSERT_FALSE(before.empty());
  ASSERT_TRUE(load_adapter(**model, fixture_dir(GetParam()) + "/adapter").ok());
  size_t i = 0;
  for (const Linear* l : (**model).norm_readers()) {
    EXPECT_EQ(l->weight.value().data_ptr(), before[i++]) << l->name << " moved when its adapter was attached";
    EXPECT_GT(l->adapter_spare(DType::bf16), 0) << l->name;
  }
  check_lora(GetParam(), opt, Tolerances{0, 0, 0, 0, true});
}

TEST_P(Family, MergedAdapterMatchesPeftMerge) { check_merged(GetParam(), {DType::f32, Device::cpu()}, kF32); }

TEST_P(Family, AdapterRoundTripsInPeftFormat) {
  const std::string v = GetParam();
  auto model = CausalLM::load(fixture_dir(v), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  auto cfg = load_adapter(**model, fixture_dir(v) + "/adapter");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const std::string out = ::testing::TempDir() + "loom_adapter_" + v;
  ASSERT_TRUE(save_adapter(**model, *cfg, out).ok());
  // Same tensor names, shapes and dtypes as PEFT's own file, and the same values.
  auto peft = read_all(fixture_dir(v) + "/adapter/adapter_model.safetensors");
  auto ours = read_all(out + "/adapter_model.safetensors");
  ASSERT_EQ(peft.size(), ours.size());
  for (auto& [name, t] : peft) {
    ASSERT_TRUE(ours.count(name)) << name;
    EXPECT_EQ(ours[name].shape(), t.shape()) << name;
    EXPECT_EQ(ours[name].dtype(), t.dtype()) << name;
    EXPECT_EQ(rel_err(ours[name], t), 0.0) << name;
  }
  auto again = CausalLM::load(fixture_dir(v), {DType::f32, Device::cpu()});
  auto cfg2 = load_adapter(**again, out);
  ASSERT_TRUE(cfg2.ok()) << cfg2.status();
  EXPECT_EQ(cfg2->r, cfg->r);
  EXPECT_EQ(cfg2->alpha, cfg->alpha);
  EXPECT_EQ(cfg2->use_rslora, cfg->use_rslora);
}

TEST_P(Family, SavedMergedCheckpointReloads) {
  const std::string v = GetParam();
  auto model = CausalLM::load(fixture_dir(v), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(load_adapter(**model, fixture_dir(v) + "/adapter").ok());
  merge_lora(**model);
  const std::string out = ::testing::TempDir() + "loom_merged_" + v;
  ASSERT_TRUE(save_pretrained(**model, out).ok());
  EXPECT_FALSE(std::filesystem::exists(out + "/adapter_config.json"));
  auto reloaded = CausalLM::load(out, {DType::f32, Device::cpu()});
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_EQ(reloaded->get()->config().torch_dtype, "bfloat16");
  ModelConfig same = (*reloaded)->config();
  same.torch_dtype = (*model)->config().torch_dtype;  // the only field the export changes
  EXPECT_EQ(same.summary(), (*model)->config().summary());
  auto in = read_all(fixture_dir(v) + "/inputs.safetensors");
  auto ref = read_all(fixture_dir(v) + "/reference_lora.safetensors");
  ag::NoGradGuard ng;
  // The export is bf16: weight rounding (2^-9 relative) through two layers moves logits ~1e-2.
  EXPECT_LT(rel_err((*reloaded)->forward(in["input_ids"]).value(), ref["merged_logits"]), 3e-2) << v;
}

TEST_P(Family, FusedLossAndGradientsMatchPeft) { check_fused_loss(GetParam(), {DType::f32, Device::cpu()}, kF32); }

INSTANTIATE_TEST_SUITE_P(Fixtures, Family, ::testing::ValuesIn(fixture_variants()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace loom::test
