// The checks every family runs against its transformers/PEFT reference, on any device and dtype.
// Used by test_families.cpp (CPU, f32) and test_families_cuda.cpp (CUDA, f32 and bf16).
#pragma once
#include "kernels/adamw.h"
#include "models/lora.h"
#include "tests/models/fixtures.h"

namespace loom::test {

struct Tolerances {
  double logits;  // relative L2 of logits
  double loss;    // relative loss difference
  double grads;   // relative L2 of each LoRA gradient
  double step;    // relative L2 of each LoRA tensor after one AdamW step
};

inline void check_base_logits(const std::string& variant, const LoadOptions& opt, const Tolerances& tol) {
  auto model = CausalLM::load(fixture_dir(variant), opt);
  ASSERT_TRUE(model.ok()) << model.status();
  auto in = read_all(fixture_dir(variant) + "/inputs.safetensors");
  auto ref = read_all(fixture_dir(variant) + "/reference.safetensors");
  ag::NoGradGuard ng;
  ag::Variable logits = (*model)->forward(in["input_ids"]);
  EXPECT_LT(rel_err(logits.value(), ref["logits"]), tol.logits) << variant << " logits";
  const float loss = causal_lm_loss(logits, in["labels"]).value().item();
  EXPECT_NEAR(loss, ref["loss"].item(), tol.loss * ref["loss"].item()) << variant << " loss";
}

inline void check_lora(const std::string& variant, const LoadOptions& opt, const Tolerances& tol) {
  auto model = CausalLM::load(fixture_dir(variant), opt);
  ASSERT_TRUE(model.ok()) << model.status();
  auto cfg = load_adapter(**model, fixture_dir(variant) + "/adapter");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto in = read_all(fixture_dir(variant) + "/inputs.safetensors");
  auto ref = read_all(fixture_dir(variant) + "/reference_lora.safetensors");
  ag::Variable logits = (*model)->forward(in["input_ids"]);
  EXPECT_LT(rel_err(logits.value(), ref["logits"]), tol.logits) << variant << " LoRA logits";
  ag::Variable loss = causal_lm_loss(logits, in["labels"]);
  EXPECT_NEAR(loss.value().item(), ref["loss"].item(), tol.loss * ref["loss"].item()) << variant << " LoRA loss";
  ag::backward(loss);
  AdamWParams p;  // the hyper-parameters make_reference.py used (manifest.json "adamw")
  p.lr = 1e-3f;
  p.weight_decay = 0.01f;
  p.step = 1;
  auto params = lora_parameters(**model);
  ASSERT_EQ(params.size() * 2, ref.size() - 3) << "one grad. and one after_step. tensor per LoRA tensor";
  for (auto& [name, v] : params) {
    ASSERT_TRUE(v->grad().defined()) << name;
    EXPECT_LT(rel_err(v->grad(), ref["grad." + name]), tol.grads) << variant << " grad of " << name;
    Tensor value = v->value();
    Tensor m = Tensor::zeros(value.shape(), DType::f32, value.device()), s = Tensor::zeros(value.shape(), DType::f32, value.device());
    ops::adamw_step(value, v->grad(), m, s, p);
    EXPECT_LT(rel_err(value, ref["after_step." + name]), tol.step) << variant << " after AdamW: " << name;
  }
}

inline void check_merged(const std::string& variant, const LoadOptions& opt, const Tolerances& tol) {
  auto model = CausalLM::load(fixture_dir(variant), opt);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(load_adapter(**model, fixture_dir(variant) + "/adapter").ok());
  merge_lora(**model);
  auto in = read_all(fixture_dir(variant) + "/inputs.safetensors");
  auto ref = read_all(fixture_dir(variant) + "/reference_lora.safetensors");
  ag::NoGradGuard ng;
  EXPECT_LT(rel_err((*model)->forward(in["input_ids"]).value(), ref["merged_logits"]), tol.logits) << variant << " merged";
}

}  // namespace loom::test
