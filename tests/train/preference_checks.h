// Shared by test_preference.cpp and test_preference_cuda.cpp: Loom's preference forward against the
// TRL references of tests/fixtures/preference (tools/reference/make_preference_reference.py), every case on
// `device` in `dtype`: loss and log-probs within `tol`, LoRA gradients within `grad_tol` (relative L2).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "engine/tensor_io.h"
#include "models/lora.h"
#include "nlohmann/json.hpp"
#include "tests/models/fixtures.h"
#include "train/preference_forward.h"

namespace loom::test {

inline const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/preference/";

inline nlohmann::json cases() {
  std::ifstream f(kDir + "cases.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

inline double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  EXPECT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

inline void check_against_trl(Device device, DType dtype, double tol, double grad_tol) {
  const nlohmann::json all = cases();
  ASSERT_EQ(all["cases"].size(), 10u);
  for (const auto& [key, c] : all["cases"].items()) {
    SCOPED_TRACE(key);
    const std::string variant = key.substr(0, key.find('/')), name = key.substr(key.find('/') + 1);
    auto model = CausalLM::load(fixture_dir(variant), {dtype, device});
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_TRUE(load_adapter(**model, fixture_dir(variant) + "/adapter").ok());
    auto in = SafetensorsFile::open(kDir + variant + "/inputs.safetensors");
    ASSERT_TRUE(in.ok()) << in.status();
    auto pairs = read_preference_pairs(*in, (*model)->config());
    ASSERT_TRUE(pairs.ok()) << pairs.status();
    PreferenceParams p;
    p.kind = *parse_preference_kind(c["objective"].get<std::string>());
    p.beta = c["beta"].get<double>();
    p.simpo_gamma = c["simpo_gamma"].get<double>();
    p.label_smoothing = c["label_smoothing"].get<double>();
    auto r = preference_forward(**model, *pairs, p);
    ASSERT_TRUE(r.ok()) << r.status();
    ag::backward(r->result.loss);
    auto ref = read_all(kDir + variant + "/" + name + ".safetensors");
    const double want = ref["loss"].to_floats()[0];
    EXPECT_NEAR(r->result.loss.value().item(), want, tol * std::max(1.0, std::fabs(want)));
    EXPECT_NEAR(r->result.metrics.loss, c["loss"].get<double>(), tol * std::max(1.0, std::fabs(c["loss"].get<double>())));
    EXPECT_LT(max_rel(r->chosen, ref["chosen_logps"].to_floats()), tol);
    EXPECT_LT(max_rel(r->rejected, ref["rejected_logps"].to_floats()), tol);
    if (needs_reference(p.kind)) {
      EXPECT_LT(max_rel(r->ref_chosen, ref["ref_chosen_logps"].to_floats()), tol);
      EXPECT_LT(max_rel(r->ref_rejected, ref["ref_rejected_logps"].to_floats()), tol);
      // The adapter moves the policy away from its reference: the test would see a reference that kept it.
      EXPECT_GT(max_rel(r->chosen, r->ref_chosen), 1e-4);
    }
    int grads = 0;
    for (auto& [pname, v] : lora_parameters(**model)) {
      ASSERT_TRUE(ref.count("grad." + pname)) << pname;
      EXPECT_LT(max_rel(v->grad().to_floats(), ref["grad." + pname].to_floats()), grad_tol) << pname;
      ++grads;
    }
    EXPECT_EQ(grads * 1u, ref.size() - (needs_reference(p.kind) ? 5 : 3));
  }
}

}  // namespace loom::test
