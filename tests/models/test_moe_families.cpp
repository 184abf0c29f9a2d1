// Mixtral and Qwen3-MoE against transformers 5.17 + PEFT 0.21 (fixtures made by
// tools/reference/make_moe_reference.py: tests/fixtures/models/{mixtral,qwen3_moe,qwen3_moe_sparse}): logits,
// the cross-entropy and the load-balancing loss (transformers' load_balancing_loss_func), every LoRA
// gradient of an adapter on the attention and on the experts (PEFT's target_parameters), merging,
// the adapter and the checkpoint written back in the formats they were read from, and the same
// figures under recompute checkpointing. CPU, f32 and bf16.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "models/causal_lm.h"
#include "models/lora.h"
#include "tests/models/moe_checks.h"
#include "tests/temp_dir.h"

namespace loom {
namespace {
using test::fixture_dir;
using test::read_all;
using test::rel_err;

class MoeFamily : public ::testing::TestWithParam<std::string> {
 protected:
  std::string dir() const { return fixture_dir(GetParam()); }
  std::unique_ptr<CausalLM> load(DType dtype = DType::f32) const {
    auto m = CausalLM::load(dir(), {dtype, Device::cpu()});
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }
  std::map<std::string, Tensor> inputs() const { return read_all(dir() + "/inputs.safetensors"); }
};

TEST_P(MoeFamily, LogitsLossAndLoadBalancingLossMatchTransformers) { test::check_moe_forward(GetParam(), Device::cpu(), 2e-5); }
TEST_P(MoeFamily, LoraOnAttentionAndExpertsMatchesPeft) { test::check_moe_lora(GetParam(), Device::cpu(), 2e-5); }
TEST_P(MoeFamily, Bf16IsCloseToPeft) { test::check_moe_bf16(GetParam(), Device::cpu()); }

// The adapter saved back is PEFT's file: the same names, shapes and values, target_parameters kept.
TEST_P(MoeFamily, AdapterAndCheckpointRoundTrip) {
  auto model = load();
  ASSERT_TRUE(model);
  auto lc = load_adapter(*model, dir() + "/adapter");
  ASSERT_TRUE(lc.ok()) << lc.status();
  test::TempDir tmp;
  ASSERT_TRUE(save_adapter(*model, *lc, tmp.path() + "/adapter").ok());
  auto theirs = read_all(dir() + "/adapter/adapter_model.safetensors");
  auto ours = read_all(tmp.path() + "/adapter/adapter_model.safetensors");
  ASSERT_EQ(ours.size(), theirs.size());
  for (const auto& [name, t] : theirs) {
    ASSERT_TRUE(ours.count(name)) << name;
    EXPECT_EQ(ours[name].shape(), t.shape()) << name;
    EXPECT_EQ(rel_err(ours[name], t), 0) << name;
  }
  auto again = load();
  auto lc2 = load_adapter(*again, tmp.path() + "/adapter");
  ASSERT_TRUE(lc2.ok()) << lc2.status();
  EXPECT_EQ(std::set<std::string>(lc2->target_parameters.begin(), lc2->target_parameters.end()),
            (std::set<std::string>{"mlp.experts.down_proj", "mlp.experts.gate_up_proj"}));

  // The base model written back: the hub's per-expert names, as transformers' save_pretrained.
  auto base = load();
  ASSERT_TRUE(save_pretrained(*base, tmp.path() + "/model").ok());
  auto written = read_all(tmp.path() + "/model/model.safetensors");
  auto original = read_all(dir() + "/model.safetensors");
  ASSERT_EQ(written.size(), original.size());
  for (const auto& [name, t] : original) {
    ASSERT_TRUE(written.count(name)) << name;
    EXPECT_LT(rel_err(written[name], t), 1e-2) << name;  // written in bf16
  }
}

// An adapter PEFT made from the v4 names (q/k/v/o, gate/up/down or w1/w2/w3): PEFT moved the MLP names to
// target_parameters and gave gate_up rank and alpha 2r, 2 alpha through rank_pattern / alpha_pattern.
TEST_P(MoeFamily, PeftAdapterFromV4NamesWithRankPattern) {
  auto model = load();
  ASSERT_TRUE(model);
  auto lc = load_adapter(*model, dir() + "/adapter_v4_targets");
  ASSERT_TRUE(lc.ok()) << lc.status();
  ASSERT_EQ(lc->rank_pattern.size(), 1u);
  EXPECT_EQ(lc->rank_for("model.layers.0.mlp.experts.gate_up_proj"), 2 * lc->r);
  EXPECT_EQ(lc->rank_for("model.layers.0.mlp.experts.down_proj"), lc->r);
  auto in = inputs();
  auto ref = read_all(dir() + "/reference_lora_v4_targets.safetensors");
  ag::NoGradGuard no_grad;
  EXPECT_LT(rel_err(model->forward(in["input_ids"]).value(), ref["logits"]), 2e-5);
  EXPECT_NEAR(model->loss(in["input_ids"], in["labels"]).value().item(), ref["loss"].item(), 1e-5);
  // Saved back with its patterns, it loads to the same adapter.
  test::TempDir tmp;
  ASSERT_TRUE(save_adapter(*model, *lc, tmp.path()).ok());
  auto again = load();
  auto lc2 = load_adapter(*again, tmp.path());
  ASSERT_TRUE(lc2.ok()) << lc2.status();
  EXPECT_EQ(lc2->rank_pattern, lc->rank_pattern);
  EXPECT_LT(rel_err(again->forward(in["input_ids"]).value(), ref["logits"]), 2e-5);
}

// QLoRA: each expert in NF4 on its own (as bitsandbytes quantises a Linear weight of its shape),
// dequantised for each product and again in backward: the same loss and LoRA gradients as a dense
// model holding the dequantised weights.
TEST_P(MoeFamily, QloraExpertsAreNf4PerExpert) {
  auto q = CausalLM::load(dir(), {DType::f32, Device::cpu(), /*quantize_4bit=*/true});
  ASSERT_TRUE(q.ok()) << q.status();
  auto d = load();
  ASSERT_TRUE(d);
  for (ExpertLinear* e : (*q)->expert_linears()) EXPECT_EQ(static_cast<int64_t>(e->nf4.size()), e->experts) << e->name;
  const auto ql = (*q)->linears(), dl = d->linears();
  for (size_t i = 0; i < ql.size(); ++i)
    if (ql[i]->quantized()) dl[i]->weight = ag::Variable(ql[i]->dense_weight(DType::f32), false);
  const auto qe = (*q)->expert_linears(), de = d->expert_linears();
  ASSERT_EQ(qe.size(), de.size());
  for (size_t i = 0; i < qe.size(); ++i) de[i]->weight = ag::Variable(qe[i]->dense_weight(DType::f32), false);
  auto in = inputs();
  std::vector<std::map<std::string, Tensor>> grads;
  std::vector<double> losses;
  for (CausalLM* m : {q->get(), d.get()}) {
    ASSERT_TRUE(load_adapter(*m, dir() + "/adapter").ok());
    const ag::Variable loss = m->loss(in["input_ids"], in["labels"]);
    losses.push_back(loss.value().item());
    ag::backward(loss);
    grads.emplace_back();
    for (const auto& [name, g] : peft_adapter_tensors(*m, true)) grads.back()[name] = g;
  }
  EXPECT_NEAR(losses[0], losses[1], 1e-5);
  // The dequantised experts differ from the originals: the loss moved, by little.
  EXPECT_NE(losses[0], read_all(dir() + "/reference_lora.safetensors")["loss"].item());
  for (const auto& [name, g] : grads[1]) EXPECT_LT(rel_err(grads[0][name], g), 1e-5) << name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MoeFamily, ::testing::ValuesIn(test::moe_variants()));

}  // namespace
}  // namespace loom
