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
  // bf16 mode: instead of the fixed bounds above, each quantity's error against the f32 reference
  // must be within kBf16Factor x PyTorch's own bf16 error (reference_lora_bf16.safetensors) plus
  // kBf16Floor: Loom in bf16 is no further from exact than twice what PyTorch's bf16 run is.
  bool relative_to_torch_bf16 = false;
};
inline constexpr double kBf16Factor = 2.0;
inline constexpr double kBf16Floor = 2e-3;

// The bound for one quantity: fixed, or scaled from PyTorch's bf16 error on the same quantity.
inline double bound(const Tolerances& tol, double fixed, const Tensor& torch_bf16, const Tensor& ref) {
  return tol.relative_to_torch_bf16 ? kBf16Factor * rel_err(torch_bf16, ref) + kBf16Floor : fixed;
}

inline void check_base_logits(const std::string& variant, const LoadOptions& opt, const Tolerances& tol) {
  auto model = CausalLM::load(fixture_dir(variant), opt);
  ASSERT_TRUE(model.ok()) << model.status();
  auto in = read_all(fixture_dir(variant) + "/inputs.safetensors");
  auto ref = read_all(fixture_dir(variant) + "/reference.safetensors");
  ag::NoGradGuard ng;
  auto bf = read_all(fixture_dir(variant) + "/reference_lora_bf16.safetensors");
  ag::Variable logits = (*model)->forward(in["input_ids"]);
  EXPECT_LT(rel_err(logits.value(), ref["logits"]), bound(tol, tol.logits, bf["base_logits"], ref["logits"]))
      << variant << " logits";
  if (tol.relative_to_torch_bf16) return;  // the bf16 file has no base-model loss; logits carry it
  const float loss = causal_lm_loss(logits, in["labels"]).value().item();
  EXPECT_NEAR(loss, ref["loss"].item(), tol.loss * ref["loss"].item()) << variant << " loss";
}

inline void check_lora(const std::string& variant, const LoadOptions& opt, const Tolerances& tol) {
  auto model = CausalLM::load(fixture_dir(variant), opt);
  ASSERT_TRUE(model.ok()) << model.status();
  auto cfg = load_adapter(**model, fixture_dir(variant) + "/adapter");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  // In bf16 every adapted dense projection that reads a norm's output has the room for the one-GEMM
  // product (Linear::widen_for_adapter), so the norms before q/k/v and gate/up leave spare columns and
  // this check covers that path.
  if (opt.dtype == DType::bf16) {
    for (const Linear* l : (**model).norm_readers()) {
      if (l->lora && !l->quantized() && l->lora->dropout == 0.f) {
        EXPECT_GT(l->adapter_spare(DType::bf16), 0) << l->name;
      }
    }
  }
  auto in = read_all(fixture_dir(variant) + "/inputs.safetensors");
  auto ref = read_all(fixture_dir(variant) + "/reference_lora.safetensors");
  auto bf = read_all(fixture_dir(variant) + "/reference_lora_bf16.safetensors");
  ag::Variable logits = (*model)->forward(in["input_ids"]);
  EXPECT_LT(rel_err(logits.value(), ref["logits"]), bound(tol, tol.logits, bf["logits"], ref["logits"]))
      << variant << " LoRA logits";
  ag::Variable loss = causal_lm_loss(logits, in["labels"]);
  EXPECT_LT(rel_err(loss.value(), ref["loss"]), bound(tol, tol.loss, bf["loss"], ref["loss"])) << variant << " LoRA loss";
  ag::backward(loss);
  AdamWParams p;  // the hyper-parameters make_reference.py used (manifest.json "adamw")
  p.lr = 1e-3f;
  p.weight_decay = 0.01f;
  p.step = 1;
  auto params = lora_parameters(**model);
  ASSERT_EQ(params.size() * 2, ref.size() - 3) << "one grad. and one after_step. tensor per LoRA tensor";
  for (auto& [name, v] : params) {
    ASSERT_TRUE(v->grad().defined()) << name;
    EXPECT_LT(rel_err(v->grad(), ref["grad." + name]), bound(tol, tol.grads, bf["grad." + name], ref["grad." + name]))
        << variant << " grad of " << name;
    if (tol.relative_to_torch_bf16) continue;  // the step is checked in f32; in bf16 it follows the grads
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

// CausalLM::loss (the fused lm_head + cross-entropy; the fixtures' adapters leave lm_head alone,
// so the fused path runs, with the soft-cap on gemma2) against PEFT's loss and LoRA gradients,
// under the same bounds as check_lora. Then, with every base weight trainable (full fine-tuning:
// lm_head's own weight gets dW, tied to the embedding on gemma and llama_tied_bf16), every weight
// gradient against the unfused causal_lm_loss(forward(...)) on the same model, in f32 only.
inline void check_fused_loss(const std::string& variant, const LoadOptions& opt, const Tolerances& tol) {
  auto model = CausalLM::load(fixture_dir(variant), opt);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(load_adapter(**model, fixture_dir(variant) + "/adapter").ok());
  auto in = read_all(fixture_dir(variant) + "/inputs.safetensors");
  auto ref = read_all(fixture_dir(variant) + "/reference_lora.safetensors");
  auto bf = read_all(fixture_dir(variant) + "/reference_lora_bf16.safetensors");
  ag::Variable loss = (*model)->loss(in["input_ids"], in["labels"]);
  ASSERT_EQ(loss.value().numel(), 1);
  EXPECT_LT(rel_err(loss.value().to(DType::f32), ref["loss"]), bound(tol, tol.loss, bf["loss"], ref["loss"]))
      << variant << " fused loss";
  ag::backward(loss);
  for (auto& [name, v] : lora_parameters(**model)) {
    ASSERT_TRUE(v->grad().defined()) << name;
    EXPECT_LT(rel_err(v->grad(), ref["grad." + name]), bound(tol, tol.grads, bf["grad." + name], ref["grad." + name]))
        << variant << " fused-loss grad of " << name;
  }
  if (tol.relative_to_torch_bf16) return;
  auto full = CausalLM::load(fixture_dir(variant), opt);
  ASSERT_TRUE(full.ok()) << full.status();
  (*full)->set_weights_trainable(true);
  auto weights = (*full)->named_weights();
  ag::backward(causal_lm_loss((*full)->forward(in["input_ids"]), in["labels"]));
  std::vector<Tensor> unfused;
  for (auto& [name, w] : weights) {
    ASSERT_TRUE(w->grad().defined()) << name;
    unfused.push_back(w->grad().clone());
    w->zero_grad();
  }
  ag::backward((*full)->loss(in["input_ids"], in["labels"]));
  for (size_t i = 0; i < weights.size(); ++i) {
    ASSERT_TRUE(weights[i].second->grad().defined()) << weights[i].first;
    EXPECT_LT(rel_err(weights[i].second->grad(), unfused[i]), tol.grads)
        << variant << " full fine-tuning grad of " << weights[i].first;
  }
}

}  // namespace loom::test
