// Decoder layers streamed from host memory (models/layer_streamer.h, `--device-map` with layers on
// "cpu"): on the CPU the streamer runs its whole protocol (one host buffer per layer, two slots,
// prefetch up in forward and down in backward, the layer pointed at its slot and back), so a
// model with four of five layers streamed must give the loss and every LoRA gradient of the same
// model unstreamed, in each checkpointing mode, over two micro-batches, dense and NF4, and the same
// greedy generation. The reference is the unstreamed run of the same code (the families' own
// PEFT references check that one); f32 on the CPU is deterministic, so the tolerance is 1e-6.
#include "tests/models/layer_stream_checks.h"

namespace loom::test {
namespace {

constexpr int64_t kLayers = kStreamLayers;

class LayerStreamerCpu : public ::testing::TestWithParam<std::string> {};

TEST_P(LayerStreamerCpu, StreamedLayersGiveTheLossGradientsAndTokensOfResidentOnes) {
  const std::string dir = five_layer_copy(GetParam(), "");
  for (bool qlora : {false, true}) {
    const StreamRun base = train_streamed(dir, qlora, std::nullopt, Checkpointing::kNone);
    ASSERT_EQ(base.losses.size(), 2u);
    ASSERT_FALSE(base.grads.empty());
    for (Checkpointing mode : {Checkpointing::kNone, Checkpointing::kRecompute, Checkpointing::kOffload}) {
      const StreamRun r = train_streamed(dir, qlora, streaming(1), mode);
      const std::string what = absl::StrCat(GetParam(), qlora ? " qlora " : " ", checkpointing_name(mode));
      for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(r.losses[i], base.losses[i], 1e-6 * std::abs(base.losses[i])) << what;
      for (auto& [param, g] : base.grads) EXPECT_LT(rel_err(r.grads.at(param), g), 1e-6) << what << " " << param;
      EXPECT_EQ(r.generated, base.generated) << what;
      // Four streamed layers: each copied once on the way up, and on the way down all but the two
      // still in the slots; the next micro-batch finds the two lowest in them. Generation (8 steps
      // of prefill and decode) walks them up each time.
      const int64_t n = kLayers - 1, training = n + 3 * (n - 2);
      EXPECT_GE(r.copies, training) << what;
      EXPECT_LE(r.copies, training + 7 * n) << what;
    }
  }
}

// In bf16 the norms' readers take the one-GEMM LoRA product when their weights have spare columns
// (loaded wide, as `loom train` loads them): a streamed layer keeps those columns (its buffer holds
// each weight's rows at their pitch), so it computes what the resident layer does, bit for bit on
// the CPU. Streamed without them, its products rounded differently (two products) and the first
// loss already differed.
TEST_P(LayerStreamerCpu, Bf16StreamedLayersComputeWhatResidentOnesDo) {
  const std::string dir = five_layer_copy(GetParam(), "bf16_");
  const StreamRun base = train_streamed(dir, false, std::nullopt, Checkpointing::kNone, Device::cpu(), DType::bf16);
  const StreamRun r = train_streamed(dir, false, streaming(1), Checkpointing::kNone, Device::cpu(), DType::bf16);
  ASSERT_EQ(base.losses.size(), 2u);
  ASSERT_EQ(r.losses.size(), 2u);
  EXPECT_EQ(r.losses[0], base.losses[0]);
  EXPECT_EQ(r.losses[1], base.losses[1]);
  for (auto& [param, g] : base.grads) EXPECT_EQ(rel_err(r.grads.at(param), g), 0.0) << param;
  EXPECT_EQ(r.generated, base.generated);
}

INSTANTIATE_TEST_SUITE_P(Families, LayerStreamerCpu, ::testing::Values("llama", "gemma2", "qwen3", "phi3", "qwen3_moe"),
                         [](const auto& info) { return info.param; });

// A preference objective's walks: the reference's log-probabilities with the adapters off and no
// gradient (a walk up outside any checkpoint), then the policy's with gradients (checkpointed walks
// up and down), twice, as DPO's micro-batches do. Streamed or not, the same numbers.
TEST(LayerStreamer, PreferenceWalksGiveTheSameLogProbabilitiesAndGradients) {
  const std::string dir = five_layer_copy("qwen3", "pref_");
  auto in = read_all(dir + "/inputs.safetensors");
  const Tensor targets = shift_labels(in["labels"]);
  auto run = [&](std::optional<Placement> placement) {
    LoadOptions lo{DType::f32, Device::cpu()};
    lo.placement = placement;
    auto model = CausalLM::load(dir, lo);
    EXPECT_TRUE(model.ok()) << model.status();
    EXPECT_TRUE(add_lora(**model, LoraConfig{}, 3).ok());
    uint64_t k = 0;
    for (auto& [name, v] : lora_parameters(**model)) {
      Tensor t = v->value();
      if (name.find("lora_B") != std::string::npos) ops::uniform_(t, 5, ++k << 32, -0.05f, 0.05f);
    }
    std::vector<double> logps;
    for (int micro = 0; micro < 2; ++micro) {
      {
        ag::NoGradGuard no_grad;
        AdaptersOff off(**model);
        for (const ag::Variable& v : (*model)->sequence_logps(in["input_ids"], targets)) logps.push_back(v.value().item());
      }
      std::vector<ag::Variable> policy = (*model)->sequence_logps(in["input_ids"], targets);
      ag::Variable sum = policy[0];
      for (size_t i = 1; i < policy.size(); ++i) sum = ag::add(sum, policy[i]);
      logps.push_back(sum.value().item());
      ag::backward(sum);
    }
    std::map<std::string, Tensor> grads;
    for (auto& [name, v] : lora_parameters(**model)) grads[name] = v->grad().clone();
    return std::make_pair(logps, grads);
  };
  const auto base = run(std::nullopt);
  const auto streamed = run(streaming(0));
  ASSERT_EQ(base.first.size(), streamed.first.size());
  for (size_t i = 0; i < base.first.size(); ++i)
    EXPECT_NEAR(streamed.first[i], base.first[i], 1e-6 * std::abs(base.first[i])) << i;
  for (auto& [param, g] : base.second) EXPECT_LT(rel_err(streamed.second.at(param), g), 1e-6) << param;
}

TEST(LayerStreamer, PrefetchFollowsTheWalkAndSlotsAreReused) {
  const std::string dir = five_layer_copy("llama", "walk_");
  LoadOptions lo{DType::f32, Device::cpu()};
  lo.placement = streaming(0);
  auto model = CausalLM::load(dir, lo);
  ASSERT_TRUE(model.ok()) << model.status();
  const LayerStreamer* s = (*model)->streamer();
  ASSERT_NE(s, nullptr);
  // One slot holds the largest layer; the host holds all five.
  EXPECT_EQ(s->host_bytes(), kLayers * s->slot_bytes());
  EXPECT_EQ(s->copies(), 0);
  Tensor ids = Tensor::from_ints({1, 5, 9, 2}, {1, 4});
  ag::NoGradGuard no_grad;
  const Tensor a = (*model)->forward(ids).value().clone();
  EXPECT_EQ(s->copies(), kLayers) << "each layer once, the next prefetched while one runs";
  const Tensor b = (*model)->forward(ids).value();
  // The slots end a walk up holding layers 3 and 4: the next walk copies every layer again.
  EXPECT_EQ(s->copies(), 2 * kLayers);
  EXPECT_EQ(rel_err(b, a), 0.0);
}

TEST(Placement, ModulesRunWhereTheirPartIsPlaced) {
  Placement p = Placement::uniform(Device::cuda(0), 3);
  p.layers[2] = Device::cuda(1);
  p.norm = p.head = Device::cuda(1);
  EXPECT_EQ(p.device_of("model.layers.2.mlp.down_proj"), Device::cuda(1));
  EXPECT_EQ(p.device_of("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"), Device::cuda(0));
  EXPECT_EQ(p.device_of("lm_head"), Device::cuda(1));
  EXPECT_EQ(p.device_of("model.norm"), Device::cuda(1));
  EXPECT_EQ(p.device_of("model.embed_tokens"), Device::cuda(0));
  EXPECT_FALSE(p.any_streamed());
}

TEST(Placement, ATiedHeadAwayFromTheEmbeddingIsRefused) {
  LoadOptions lo{DType::f32, Device::cpu()};
  Placement p = Placement::uniform(Device::cpu(), 2);
  p.head = Device::cuda(0);
  lo.placement = p;
  auto model = CausalLM::load(fixture_dir("llama_tied_bf16"), lo);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(std::string(model.status().message()).find("tied"), std::string::npos) << model.status();
  lo.placement = Placement::uniform(Device::cpu(), 3);
  model = CausalLM::load(fixture_dir("llama"), lo);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(std::string(model.status().message()).find("places 3 decoder layers"), std::string::npos) << model.status();
}

}  // namespace
}  // namespace loom::test
