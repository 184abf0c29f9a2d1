// Preference objectives against TRL: `tools/reference/make_preference_reference.py` ran TRL 1.15's own loss
// code (CPOTrainer.cpo_loss, ORPOTrainer.odds_ratio_loss) on transformers + PEFT log-probabilities of
// the llama and phi3 fixtures (phi3: LoRA on the fused qkv_proj / gate_up_proj) and dumped the loss,
// both sides' summed log-probabilities, the reference's (adapters disabled) and every LoRA gradient.
// Also: the loss formulas' derivatives against central differences in f64, and the adapters-off scope.
#include "tests/train/preference_checks.h"

namespace loom::test {
namespace {

// f32 on both sides, summation order apart: the loss and log-probs to ~1e-6, the gradients through
// two layers and the loss's own derivative to 1e-4 (test_families.cpp's bound).
TEST(PreferenceTrl, LossLogpsAndLoraGradientsMatchTrl) { check_against_trl(Device::cpu(), DType::f32, 2e-5, 1e-4); }

// The loss formulas' gradients (what backward hands the model) against central differences of the
// f64 loss, for every objective, with smoothing, at log-probs of real size (-5..-40 over 3..12 tokens).
TEST(PreferenceLoss, DerivativesMatchCentralDifferences) {
  const std::vector<double> c = {-12.5, -33.0, -7.25}, r = {-14.0, -29.5, -9.0}, rc = {-13.0, -31.0, -8.0},
                            rr = {-13.5, -30.0, -8.5};
  const std::vector<int64_t> nc = {5, 12, 3}, nr = {6, 10, 4};
  for (PreferenceKind k : {PreferenceKind::kDpo, PreferenceKind::kIpo, PreferenceKind::kSimpo, PreferenceKind::kOrpo})
    for (double ls : {0.0, 0.2}) {
      if (ls > 0 && (k == PreferenceKind::kIpo || k == PreferenceKind::kOrpo)) continue;
      SCOPED_TRACE(std::string(preference_name(k)) + " ls " + std::to_string(ls));
      PreferenceParams p{k, 0.3, 0.5, ls};
      auto loss_at = [&](const std::vector<double>& x, bool grad, std::vector<ag::Variable>* leaves) {
        PairScores s;
        for (size_t i = 0; i < x.size(); ++i) {
          ag::Variable v(Tensor::full({}, static_cast<float>(x[i]), DType::f32), grad);
          (i < 3 ? s.chosen : s.rejected).push_back(v);
          if (leaves) leaves->push_back(v);
        }
        s.chosen_tokens = nc, s.rejected_tokens = nr, s.ref_chosen = rc, s.ref_rejected = rr;
        return *preference_loss(s, p);
      };
      std::vector<double> x = c;
      x.insert(x.end(), r.begin(), r.end());
      std::vector<ag::Variable> leaves;
      PreferenceResult res = loss_at(x, true, &leaves);
      ag::backward(res.loss);
      for (size_t i = 0; i < x.size(); ++i) {
        const double h = 1e-3;
        std::vector<double> up = x, down = x;
        up[i] += h, down[i] -= h;
        // The inputs are f32 scalars: x +- h is exact in f32 at these magnitudes (multiples of 2^-10).
        const double fd = (loss_at(up, false, nullptr).metrics.loss - loss_at(down, false, nullptr).metrics.loss) / (2 * h);
        EXPECT_NEAR(leaves[i].grad().item(), fd, 1e-4 * std::max(1.0, std::fabs(fd))) << "input " << i;
      }
      EXPECT_EQ(res.metrics.pairs, 3);
    }
}

TEST(PreferenceLoss, BadInputIsAClearError) {
  PairScores s;
  s.chosen = {ag::Variable(Tensor::full({}, -3.f, DType::f32))};
  s.rejected = {ag::Variable(Tensor::full({}, -4.f, DType::f32))};
  s.chosen_tokens = {2}, s.rejected_tokens = {0};
  PreferenceParams p{PreferenceKind::kSimpo};
  auto r = preference_loss(s, p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("pair 0 has a completion without tokens"), std::string::npos) << r.status();
  s.rejected_tokens = {3};
  p.kind = PreferenceKind::kDpo;  // no reference given
  EXPECT_NE(preference_loss(s, p).status().message().find("needs the reference"), std::string::npos);
  p.kind = PreferenceKind::kSimpo;
  p.beta = 0;
  EXPECT_NE(preference_loss(s, p).status().message().find("--beta must be > 0"), std::string::npos);
  EXPECT_FALSE(parse_preference_kind("kto").ok());
}

// AdaptersOff: inside the scope the model is its base (transformers' logits for the fixture without
// the adapter), after it the adapter is back; no weight is copied or changed.
TEST(AdaptersOff, TheScopeGivesTheBaseModelAndRestoresTheAdapter) {
  auto model = CausalLM::load(fixture_dir("phi3"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(load_adapter(**model, fixture_dir("phi3") + "/adapter").ok());
  auto in = read_all(fixture_dir("phi3") + "/inputs.safetensors");
  auto base = read_all(fixture_dir("phi3") + "/reference.safetensors");
  auto lora = read_all(fixture_dir("phi3") + "/reference_lora.safetensors");
  ag::NoGradGuard ng;
  {
    AdaptersOff off(**model);
    EXPECT_LT(rel_err((*model)->forward(in["input_ids"]).value(), base["logits"]), 2e-5);
  }
  EXPECT_LT(rel_err((*model)->forward(in["input_ids"]).value(), lora["logits"]), 2e-5);
}

}  // namespace
}  // namespace loom::test
