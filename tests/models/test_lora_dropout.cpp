// LoRA dropout is a training-time regulariser: an adapter saved with lora_dropout > 0 must give the
// same logits in forward/generate as with dropout 0 (as PEFT's eval mode and `loom merge` do), and
// only a model the trainer marks as training draws dropout masks.
#include <gtest/gtest.h>

#include "models/causal_lm.h"
#include "models/lora.h"
#include "tests/models/fixtures.h"

namespace loom {
namespace {

using test::fixture_dir;
using test::read_all;

Tensor logits(const CausalLM& m, const Tensor& ids) { return m.forward(ids).value().to(DType::f32); }

TEST(LoraDropout, OnlyWhileTraining) {
  auto model = CausalLM::load(fixture_dir("qwen2"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(load_adapter(**model, fixture_dir("qwen2") + "/adapter").ok());
  const Tensor ids = read_all(fixture_dir("qwen2") + "/inputs.safetensors")["input_ids"];
  const Tensor reference = logits(**model, ids);  // the fixture adapter has dropout 0
  for (Linear* l : (*model)->linears())
    if (l->lora) l->lora->dropout = 0.5f, l->lora->dropout_seed = 1234;
  EXPECT_EQ(test::rel_err(logits(**model, ids), reference), 0.0) << "dropout ran outside training";
  for (Linear* l : (*model)->linears())
    if (l->lora) l->lora->training = true;
  EXPECT_GT(test::rel_err(logits(**model, ids), reference), 1e-4) << "a training model draws no dropout";
}

}  // namespace
}  // namespace loom
