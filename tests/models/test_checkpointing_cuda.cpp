// --checkpointing on CUDA: recompute and offload (layer inputs through pinned host memory on a side
// stream, copied back one layer ahead) give the loss and LoRA gradients of keeping everything, for
// every family fixture with its PEFT adapter, over two micro-batches (the offload buffers are
// reused). f32 runs the same deterministic kernels again: equal to 1e-6. bf16 goes through flash
// attention, whose backward sums dQ with f32 atomics in a varying order: within 1e-2, far below
// the 4-bit or bf16 error budgets of the fixture tests (and checked against none, not PEFT).
#include <map>

#include "models/causal_lm.h"
#include "models/lora.h"
#include "engine/offload.h"
#include "tests/models/fixtures.h"

namespace loom::test {
namespace {

struct ModeRun {
  std::vector<double> losses;
  std::map<std::string, Tensor> grads;
};

ModeRun train_two_micro_batches(const std::string& variant, DType dtype, Checkpointing mode) {
  ModeRun out;
  auto model = CausalLM::load(fixture_dir(variant), {dtype, Device::cuda(0)});
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return out;
  EXPECT_TRUE(load_adapter(**model, fixture_dir(variant) + "/adapter").ok());
  (*model)->set_checkpointing(mode);
  auto in = read_all(fixture_dir(variant) + "/inputs.safetensors");
  for (int micro = 0; micro < 2; ++micro) {
    ag::Variable loss = (*model)->loss(in["input_ids"], in["labels"]);
    out.losses.push_back(loss.value().to_doubles()[0]);
    ag::backward(loss);
  }
  for (auto& [name, v] : lora_parameters(**model)) out.grads[name] = v->grad().to(Device::cpu());
  return out;
}

class CheckpointingCuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CheckpointingCuda, ModesGiveTheSameLossAndGradients) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const double tol = dtype == DType::f32 ? 1e-6 : 1e-2;
    const ModeRun none = train_two_micro_batches(GetParam(), dtype, Checkpointing::kNone);
    ASSERT_FALSE(none.grads.empty());
    for (Checkpointing mode : {Checkpointing::kRecompute, Checkpointing::kOffload}) {
      const ModeRun r = train_two_micro_batches(GetParam(), dtype, mode);
      ASSERT_EQ(r.losses.size(), none.losses.size());
      for (size_t i = 0; i < r.losses.size(); ++i)
        EXPECT_NEAR(r.losses[i], none.losses[i], tol * std::abs(none.losses[i])) << checkpointing_name(mode);
      for (auto& [param, g] : none.grads)
        EXPECT_LT(rel_err(r.grads.at(param), g), tol) << checkpointing_name(mode) << " " << name(dtype) << " " << param;
    }
  }
  EXPECT_EQ(offload_stats().host_bytes, 0) << "every offloaded layer input came back";
}

// Offload's attention stash: with room every layer's attention output goes to the host and its
// rerun takes it back (one a layer and micro-batch); with a pinned budget just large enough for the
// layer inputs nothing is stashed and no input is pushed back onto the GPU by it; with none at all
// nothing is stashed either. The results are the same every time.
TEST_P(CheckpointingCuda, OffloadStashesAttentionInWhatTheInputsLeave) {
  const ModeRun none = train_two_micro_batches(GetParam(), DType::f32, Checkpointing::kNone);
  ASSERT_FALSE(none.grads.empty());
  auto model = CausalLM::load(fixture_dir(GetParam()), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  auto in = read_all(fixture_dir(GetParam()) + "/inputs.safetensors");
  const int64_t inputs = c.num_hidden_layers * in["input_ids"].numel() * c.hidden_size * 4;  // f32 layer inputs
  struct Budget {
    int64_t bytes;
    bool stashes;
  } budgets[] = {{int64_t(1) << 40, true}, {inputs + inputs / 16, false}, {1, false}};
  for (const Budget& b : budgets) {
    set_offload_host_budget(b.bytes);
    const int64_t hits = ag::stash_hits(), kept = offload_stats().kept_on_device;
    const ModeRun r = train_two_micro_batches(GetParam(), DType::f32, Checkpointing::kOffload);
    const int64_t taken = ag::stash_hits() - hits;
    EXPECT_EQ(taken, b.stashes ? 2 * c.num_hidden_layers : 0) << "budget " << b.bytes;
    if (b.bytes > 1) {
      EXPECT_EQ(offload_stats().kept_on_device, kept) << "budget " << b.bytes << ": inputs kept on the GPU";
    }
    for (size_t i = 0; i < r.losses.size(); ++i) EXPECT_NEAR(r.losses[i], none.losses[i], 1e-6 * std::abs(none.losses[i]));
    for (auto& [param, g] : none.grads) EXPECT_LT(rel_err(r.grads.at(param), g), 1e-6) << param;
  }
  set_offload_host_budget(-1);  // back to the default
  EXPECT_EQ(offload_stats().host_bytes, 0) << "every offloaded tensor came back";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CheckpointingCuda, ::testing::ValuesIn(fixture_variants()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace loom::test
