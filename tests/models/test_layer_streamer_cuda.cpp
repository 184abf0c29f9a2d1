// Layers streamed from pinned host memory to the GPU (models/layer_streamer.h) on CUDA: the copies
// run on the upload stream, ordered with events against the compute stream, a layer ahead. Four of
// five layers streamed must give the loss, every LoRA gradient and the greedy tokens of the same
// model resident on the GPU. f32 runs the same deterministic kernels: 1e-6. bf16 goes through flash
// attention, whose backward adds dQ in a varying order: within 1e-2 as the checkpointing modes are
// (test_checkpointing_cuda.cpp), tokens equal.
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

INSTANTIATE_TEST_SUITE_P(Families, LayerStreamerCuda, ::testing::Values("llama", "gemma2", "qwen3", "qwen3_moe"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace loom::test
