// Layers streamed from pinned host memory to the GPU (models/layer_streamer.h) on CUDA: the copies
// run on the upload stream, ordered with events against the compute stream, a layer ahead. Four of
// five layers streamed must give the loss, every LoRA gradient and the greedy tokens of the same
// model resident on the GPU. f32 runs the same deterministic kernels: 1e-6. bf16 goes through flash
// attention, whose backward adds dQ in a varying order: within 1e-2 as the checkpointing modes are
// (test_checkpointing_cuda.cpp), tokens equal. And a model placed over two devices.
#include "engine/offload.h"
#include "tests/models/layer_stream_checks.h"

namespace loom::test {
namespace {

class LayerStreamerCuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(LayerStreamerCuda, StreamedLayersGiveTheLossGradientsAndTokensOfResidentOnes) {
  const std::string dir = five_layer_copy(GetParam(), "cuda_");
  const Device gpu = Device::cuda(0);
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool qlora : {false, true}) {
      const double tol = dtype == DType::f32 ? 1e-6 : 1e-2;
      const StreamRun base = train_streamed(dir, qlora, std::nullopt, Checkpointing::kRecompute, gpu, dtype);
      ASSERT_EQ(base.losses.size(), 2u);
      for (Checkpointing mode : {Checkpointing::kNone, Checkpointing::kOffload}) {
        const StreamRun r = train_streamed(dir, qlora, streaming(1, gpu), mode, gpu, dtype);
        const std::string what = absl::StrCat(GetParam(), " ", std::string(name(dtype)), qlora ? " qlora " : " ", checkpointing_name(mode));
        ASSERT_EQ(r.losses.size(), 2u) << what;
        // The first micro-batch's forward is deterministic in every dtype.
        EXPECT_EQ(r.losses[0], base.losses[0]) << what;
        EXPECT_NEAR(r.losses[1], base.losses[1], tol * std::abs(base.losses[1])) << what;
        for (auto& [param, g] : base.grads) EXPECT_LT(rel_err(r.grads.at(param), g), tol) << what << " " << param;
        EXPECT_EQ(r.generated, base.generated) << what;
        EXPECT_GE(r.copies, 4 + 3 * 2) << what;
      }
    }
  EXPECT_EQ(offload_stats().host_bytes, 0) << "every offloaded layer input came back";
}

// A model over two devices (what a --device-map over two GPUs does, with the CPU standing in for the
// second GPU on a one-GPU machine): layers 0-1 on cuda:0, layers 2-4, the final norm and lm_head on
// the CPU, activations hopping by ag::to_device both ways, each layer's LoRA where it runs. f32: the
// CPU's and CUDA's kernels differ in their summation order only, 1e-5.
TEST_P(LayerStreamerCuda, LayersOverTwoDevicesGiveTheLossAndGradientsOfOne) {
  const std::string dir = five_layer_copy(GetParam(), "split_");
  const Device gpu = Device::cuda(0);
  Placement split = Placement::uniform(gpu, kStreamLayers);
  for (int64_t i = 2; i < kStreamLayers; ++i) split.layers[i] = Device::cpu();
  split.norm = split.head = Device::cpu();
  auto config = ModelConfig::load(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  if (config->tie_word_embeddings) split.head = gpu;  // a tied head runs where the embedding is
  for (Checkpointing mode : {Checkpointing::kNone, Checkpointing::kRecompute}) {
    const StreamRun base = train_streamed(dir, false, std::nullopt, mode, gpu, DType::f32);
    const StreamRun r = train_streamed(dir, false, split, mode, gpu, DType::f32);
    const std::string what = absl::StrCat(GetParam(), " ", checkpointing_name(mode));
    ASSERT_EQ(r.losses.size(), 2u) << what;
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(r.losses[i], base.losses[i], 1e-5 * std::abs(base.losses[i])) << what;
    for (auto& [param, g] : base.grads) EXPECT_LT(rel_err(r.grads.at(param), g), 1e-5) << what << " " << param;
    EXPECT_EQ(r.generated, base.generated) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, LayerStreamerCuda, ::testing::Values("llama", "gemma2", "qwen3", "qwen3_moe"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace loom::test
