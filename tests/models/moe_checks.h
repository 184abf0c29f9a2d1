// The MoE family checks of test_moe_families.cpp (CPU) and test_moe_families_cuda.cpp, against the
// transformers 5.17 + PEFT 0.21 fixtures of tools/reference/make_moe_reference.py.
#pragma once
#include <gtest/gtest.h>

#include "autograd/tape.h"
#include "models/causal_lm.h"
#include "models/lora.h"
#include "tests/models/fixtures.h"

namespace loom::test {

constexpr double kMoeAuxCoef = 0.02;  // the fixtures' router_aux_loss_coef

inline std::unique_ptr<CausalLM> load_moe(const std::string& variant, DType dtype, Device device) {
  auto m = CausalLM::load(fixture_dir(variant), {dtype, device});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

// Logits, the cross-entropy and the load-balancing loss (alone and with the coefficient), f32.
inline void check_moe_forward(const std::string& variant, Device device, double tol) {
  auto model = load_moe(variant, DType::f32, device);
  ASSERT_TRUE(model);
  EXPECT_GT(model->config().moe.experts, 1);
  auto in = read_all(fixture_dir(variant) + "/inputs.safetensors");
  auto ref = read_all(fixture_dir(variant) + "/reference.safetensors");
  ag::NoGradGuard no_grad;
  EXPECT_LT(rel_err(model->forward(in["input_ids"]).value(), ref["logits"]), tol);
  ag::Variable aux;
  ForwardOptions opt;
  opt.aux_loss = &aux;
  const ag::Variable ce = model->loss(in["input_ids"], in["labels"], opt);
  EXPECT_NEAR(ce.value().item(), ref["loss"].item(), tol);
  ASSERT_TRUE(aux.defined());
  EXPECT_NEAR(aux.value().item(), ref["aux_loss"].item(), tol);
  opt.aux_loss = nullptr;
  opt.router_aux_loss_coef = kMoeAuxCoef;
  EXPECT_NEAR(model->loss(in["input_ids"], in["labels"], opt).value().item(), ref["loss_with_aux"].item(), tol);
  // transformers' aux_loss with an attention_mask (right padding): the same means over the unmasked
  // tokens alone, given to Loom as the spans of the mask's runs of ones.
  ASSERT_TRUE(in.count("attention_mask_padded") && ref.count("aux_loss_masked"));
  const Tensor mask = in["attention_mask_padded"];
  const std::vector<int32_t> m = mask.to_ints();
  const int64_t seq = mask.size(1);
  ForwardOptions masked;
  for (int64_t i = 0; i < static_cast<int64_t>(m.size()); ++i)
    if (m[i] != 0) {
      if (i % seq != 0 && m[i - 1] != 0) ++masked.aux_spans.back().length;
      else masked.aux_spans.push_back({i, 1});
    }
  ASSERT_LT(masked.aux_spans.back().length + masked.aux_spans.back().start, static_cast<int64_t>(m.size()))
      << "the fixture's mask pads nothing";
  ag::Variable aux_masked;
  masked.aux_loss = &aux_masked;
  model->loss(in["input_ids"], in["labels"], masked);
  ASSERT_TRUE(aux_masked.defined());
  EXPECT_NEAR(aux_masked.value().item(), ref["aux_loss_masked"].item(), tol);
  EXPECT_GT(std::abs(ref["aux_loss_masked"].item() - ref["aux_loss"].item()), 10 * tol) << "the mask changes nothing";
  // sequence_logps (the preference objectives' forward) gives the same over the same spans.
  ag::Variable aux_seq;
  masked.aux_loss = &aux_seq;
  model->sequence_logps(in["input_ids"], shift_labels(in["labels"]), masked);
  ASSERT_TRUE(aux_seq.defined());
  EXPECT_NEAR(aux_seq.value().item(), ref["aux_loss_masked"].item(), tol);
}

// Every adapter gradient in PEFT's names and layouts, with and without the auxiliary loss, with and
// without recompute checkpointing; the adapter's logits and the merged model's. f32.
inline void check_moe_lora(const std::string& variant, Device device, double tol) {
  const std::string dir = fixture_dir(variant);
  auto in = read_all(dir + "/inputs.safetensors");
  auto ref = read_all(dir + "/reference_lora.safetensors");
  for (Checkpointing mode : {Checkpointing::kNone, Checkpointing::kRecompute})
    for (bool with_aux : {false, true}) {
      auto model = load_moe(variant, DType::f32, device);
      ASSERT_TRUE(model);
      auto lc = load_adapter(*model, dir + "/adapter");
      ASSERT_TRUE(lc.ok()) << lc.status();
      EXPECT_FALSE(lc->target_parameters.empty());
      model->set_checkpointing(mode);
      ForwardOptions opt;
      opt.router_aux_loss_coef = with_aux ? kMoeAuxCoef : 0;
      const ag::Variable loss = model->loss(in["input_ids"], in["labels"], opt);
      EXPECT_NEAR(loss.value().item(), ref[with_aux ? "loss_with_aux" : "loss"].item(), tol);
      ag::backward(loss);
      const std::string prefix = with_aux ? "grad_with_aux." : "grad.";
      int experts = 0, checked = 0;
      for (const auto& [name, g] : peft_adapter_tensors(*model, true)) {
        ASSERT_TRUE(ref.count(prefix + name)) << name;
        ASSERT_TRUE(g.defined()) << name;
        EXPECT_LT(rel_err(g, ref[prefix + name]), 5 * tol) << name << " " << checkpointing_name(mode) << " aux " << with_aux;
        experts += name.find(".mlp.experts.") != std::string::npos;
        ++checked;
      }
      int want = 0;
      for (const auto& [name, t] : ref) want += name.starts_with(prefix);
      EXPECT_EQ(checked, want);
      EXPECT_GT(experts, 0);
    }
  auto model = load_moe(variant, DType::f32, device);
  ASSERT_TRUE(load_adapter(*model, dir + "/adapter").ok());
  ag::NoGradGuard no_grad;
  EXPECT_LT(rel_err(model->forward(in["input_ids"]).value(), ref["logits"]), tol);
  merge_lora(*model);
  EXPECT_LT(rel_err(model->forward(in["input_ids"]).value(), ref["merged_logits"]), tol);
}

// bf16 against PEFT's bf16 model (made on the device its metadata names): the loss and every
// gradient within bf16 rounding, with each checkpointing mode (whose reruns record the MoE layers'
// down products and sums unread).
inline void check_moe_bf16(const std::string& variant, Device device) {
  const std::string dir = fixture_dir(variant);
  auto in = read_all(dir + "/inputs.safetensors");
  auto ref = read_all(dir + "/reference_lora_bf16.safetensors");
  for (Checkpointing mode : {Checkpointing::kNone, Checkpointing::kRecompute, Checkpointing::kOffload}) {
    auto model = load_moe(variant, DType::bf16, device);
    ASSERT_TRUE(model);
    ASSERT_TRUE(load_adapter(*model, dir + "/adapter").ok());
    model->set_checkpointing(mode);
    const int64_t unread = ag::unread_outputs();
    const ag::Variable loss = model->loss(in["input_ids"], in["labels"]);
    EXPECT_NEAR(loss.value().item(), ref["loss"].item(), 0.02) << checkpointing_name(mode);
    ag::backward(loss);
    int64_t moe_layers = 0;
    for (int64_t i = 0; i < model->config().num_hidden_layers; ++i) moe_layers += model->config().is_moe_layer(i);
    EXPECT_EQ(ag::unread_outputs() - unread,
              mode == Checkpointing::kNone ? 0 : 2 * model->config().num_hidden_layers + moe_layers)
        << checkpointing_name(mode);
    for (const auto& [name, g] : peft_adapter_tensors(*model, true)) {
      ASSERT_TRUE(ref.count("grad." + name)) << name;
      EXPECT_LT(rel_err(g, ref["grad." + name]), 0.08) << name << " " << checkpointing_name(mode);
    }
  }
}

inline const std::vector<std::string>& moe_variants() {
  static const std::vector<std::string> v = {"mixtral", "qwen3_moe", "qwen3_moe_sparse"};
  return v;
}

}  // namespace loom::test
