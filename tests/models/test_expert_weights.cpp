// WeightLoader::experts (models/weight_loader.h): a mixture-of-experts projection stacked from the
// per-expert tensors hub checkpoints hold (Mixtral's w1 then w3 rows per expert, as transformers 5.x
// fuses gate_up_proj), or read as transformers 5.x's fused tensor; a missing expert is named.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "models/config.h"
#include "models/weight_loader.h"

namespace loom {
namespace {

constexpr int64_t kE = 3, kI = 2, kH = 4;

Tensor values(int64_t rows, int64_t cols, float base) {
  std::vector<float> v(rows * cols);
  for (size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<float>(i);
  return Tensor::from_floats(v, {rows, cols});
}

ModelConfig config() {
  auto c = ModelConfig::from_json_text(R"({"model_type": "llama", "vocab_size": 8, "hidden_size": 4,
      "intermediate_size": 2, "num_hidden_layers": 1, "num_attention_heads": 1})", "test");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

const std::vector<std::string> kParts = {"model.layers.0.block_sparse_moe.experts.{e}.w1.weight",
                                         "model.layers.0.block_sparse_moe.experts.{e}.w3.weight"};
const std::string kFused = "model.layers.0.mlp.experts.gate_up_proj";

TEST(ExpertWeights, PerExpertTensorsStackGateRowsThenUpRows) {
  std::map<std::string, Tensor> t;
  for (int64_t e = 0; e < kE; ++e) {
    t[absl::StrCat("model.layers.0.block_sparse_moe.experts.", e, ".w1.weight")] = values(kI, kH, 100.f * e);
    t[absl::StrCat("model.layers.0.block_sparse_moe.experts.", e, ".w3.weight")] = values(kI, kH, 100.f * e + 50);
  }
  const Checkpoint ck = Checkpoint::from_tensors("per-expert", t);
  const ModelConfig c = config();
  detail::WeightLoader w(c, &ck, DType::f32, Device::cpu(), 0, false, std::nullopt);
  auto v = w.experts(kParts, {kI, kI}, kE, kH, kFused);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->shape(), (Shape{kE, 2 * kI, kH}));
  const std::vector<float> got = v->value().to_floats();
  for (int64_t e = 0; e < kE; ++e)
    for (int64_t r = 0; r < 2 * kI; ++r)
      for (int64_t col = 0; col < kH; ++col) {
        const float want = 100.f * e + (r < kI ? 0.f : 50.f) + static_cast<float>((r % kI) * kH + col);
        EXPECT_EQ(got[(e * 2 * kI + r) * kH + col], want) << e << " " << r << " " << col;
      }
  // Every per-expert tensor was consumed.
  EXPECT_TRUE(w.check_unexpected(nullptr).ok());
}

TEST(ExpertWeights, TheFusedNameIsReadAsItIsAndAMissingExpertIsNamed) {
  const ModelConfig c = config();
  const Tensor fused = values(kE * 2 * kI, kH, 7.f).reshape({kE, 2 * kI, kH});
  const Checkpoint ck = Checkpoint::from_tensors("fused", {{kFused, fused}});
  detail::WeightLoader w(c, &ck, DType::f32, Device::cpu(), 0, false, std::nullopt);
  auto v = w.experts(kParts, {kI, kI}, kE, kH, kFused);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->value().to_floats(), fused.to_floats());
  std::map<std::string, Tensor> partial = {{"model.layers.0.block_sparse_moe.experts.0.w1.weight", values(kI, kH, 0)},
                                           {"model.layers.0.block_sparse_moe.experts.0.w3.weight", values(kI, kH, 0)}};
  const Checkpoint ck2 = Checkpoint::from_tensors("partial", partial);
  detail::WeightLoader w2(c, &ck2, DType::f32, Device::cpu(), 0, false, std::nullopt);
  auto bad = w2.experts(kParts, {kI, kI}, kE, kH, kFused);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("experts.1.w1.weight' (expert 1 of 3)"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace loom
