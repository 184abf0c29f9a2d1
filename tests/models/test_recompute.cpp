// --checkpointing recompute and offload on the CPU, for every family fixture with its PEFT adapter
// (the MoE ones too): the rerun in backward skips what nothing reads (a pre-norm layer's down_proj
// and last residual add, recorded with OutputUse::kRootOnly: one unread output a dense layer whose
// down_proj has an adapter (the add rides in its product, ag::glu_lora_linear's residual), two a dense
// layer without, three a MoE layer, whose experts' down product and their sum go unread; none for Gemma 2/3's sandwich
// layers, whose post-feedforward norm reads down_proj's output); under offload it also takes each
// layer's attention output from the first run's stash (one a layer); and the loss and every LoRA
// gradient are those of keeping everything, bit for bit (f32, the same kernels in the same order).
#include <map>

#include "autograd/functions.h"
#include "autograd/tape.h"
#include "models/causal_lm.h"
#include "models/lora.h"
#include "tests/models/fixtures.h"

namespace loom::test {
namespace {

struct StepRun {
  double loss = 0;
  std::map<std::string, std::vector<double>> grads;
  int64_t unread = 0;  // outputs the step recorded unread
  int64_t stashed = 0;  // attention outputs the reruns took from a stash
  int64_t layers = 0;
  int64_t moe_layers = 0;
  int64_t folded_layers = 0;  // dense layers whose down_proj has an adapter (the residual add in its product)
};

StepRun train_step(const std::string& variant, Checkpointing mode) {
  StepRun out;
  auto model = CausalLM::load(fixture_dir(variant), {DType::f32, Device::cpu()});
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return out;
  EXPECT_TRUE(load_adapter(**model, fixture_dir(variant) + "/adapter").ok());
  (*model)->set_checkpointing(mode);
  out.layers = (*model)->config().num_hidden_layers;
  const auto adapters = lora_parameters(**model);
  for (int64_t i = 0; i < out.layers; ++i) {
    const bool moe = (*model)->config().is_moe_layer(i);
    out.moe_layers += moe ? 1 : 0;
    const std::string down = "layers." + std::to_string(i) + ".mlp.down_proj.";
    bool adapted = false;
    for (const auto& [name, v] : adapters) adapted = adapted || name.find(down) != std::string::npos;
    out.folded_layers += !moe && adapted ? 1 : 0;
  }
  auto in = read_all(fixture_dir(variant) + "/inputs.safetensors");
  const int64_t before = ag::unread_outputs(), hits = ag::stash_hits();
  ag::Variable loss = (*model)->loss(in["input_ids"], in["labels"]);
  out.loss = loss.value().to_doubles()[0];
  ag::backward(loss);
  out.unread = ag::unread_outputs() - before;
  out.stashed = ag::stash_hits() - hits;
  for (auto& [name, v] : lora_parameters(**model)) out.grads[name] = v->grad().to_doubles();
  return out;
}

class Recompute : public ::testing::TestWithParam<std::string> {};

TEST_P(Recompute, SkipsWhatNothingReadsWithTheSameGradients) {
  const StepRun none = train_step(GetParam(), Checkpointing::kNone);
  ASSERT_FALSE(none.grads.empty());
  EXPECT_EQ(none.unread, 0) << "without checkpointing every output is read";
  EXPECT_EQ(none.stashed, 0);
  const bool sandwich = GetParam().rfind("gemma2", 0) == 0 || GetParam().rfind("gemma3", 0) == 0;
  for (Checkpointing mode : {Checkpointing::kRecompute, Checkpointing::kOffload}) {
    const StepRun rerun = train_step(GetParam(), mode);
    const std::string what = checkpointing_name(mode);
    EXPECT_EQ(rerun.unread, sandwich ? 0 : 2 * rerun.layers + rerun.moe_layers - rerun.folded_layers)
        << what << ": down_proj (and a MoE layer's sum of its experts' rows) and the residual add of each layer"
        << " (one output where down_proj's product adds the residual)";
    EXPECT_EQ(rerun.stashed, mode == Checkpointing::kOffload ? rerun.layers : 0) << what << ": attention outputs stashed";
    EXPECT_EQ(rerun.loss, none.loss) << what;
    for (const auto& [param, g] : none.grads) EXPECT_EQ(rerun.grads.at(param), g) << what << " " << param;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Recompute, ::testing::ValuesIn(fixture_variants()),
                         [](const auto& info) { return info.param; });
// qwen3_moe_sparse has dense layers (mlp_only_layers) between its MoE ones.
INSTANTIATE_TEST_SUITE_P(MoeFixtures, Recompute, ::testing::Values("mixtral", "qwen3_moe", "qwen3_moe_sparse"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace loom::test
