// The device planner (train/device_plan.h): units sized as the loaded model measures them (its
// weights dense and in NF4, its LoRA parameters), the strategies' placements, accelerate's
// --max-memory and device_map JSON, and refusals that say what would fit.
#include "train/device_plan.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "models/causal_lm.h"
#include "models/lora.h"
#include "tests/models/fixtures.h"

namespace loom {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// Bytes of the model's tensors whose names start with `prefix` + "." (dense weights, and NF4
// weights' packed codes and scales).
int64_t measured(const CausalLM& m, const std::string& prefix) {
  int64_t b = 0;
  for (const auto& [name, v] : m.named_weights())
    if (name.rfind(prefix + ".", 0) == 0) b += v->value().nbytes();
  for (const Linear* l : m.linears())
    if (l->quantized() && l->name.rfind(prefix + ".", 0) == 0)
      for (const Tensor* t : {&l->nf4->packed, &l->nf4->absmax, &l->nf4->nested_absmax})
        if (t->defined()) b += t->nbytes();
  return b;
}

TEST(DevicePlan, UnitsWeighWhatTheLoadedModelHolds) {
  for (const std::string family : {"llama", "qwen2", "gemma2", "qwen3"})
  for (bool qlora : {false, true}) {
    LoadOptions lo{DType::bf16, Device::cpu()};
    lo.quantize_4bit = qlora;
    auto model = CausalLM::load(test::fixture_dir(family), lo);
    ASSERT_TRUE(model.ok()) << model.status();
    PlanOptions o;
    o.qlora = qlora;
    const std::vector<PlanUnit> units = plan_units((*model)->config(), o);
    ASSERT_EQ(units.size(), static_cast<size_t>((*model)->config().num_hidden_layers + 3));
    EXPECT_EQ(units[0].weight_bytes, measured(**model, "model.embed_tokens"));
    EXPECT_EQ(units[1].weight_bytes, measured(**model, "model.layers.0")) << family << " qlora " << qlora;
    EXPECT_EQ(units[units.size() - 2].weight_bytes, measured(**model, "model.norm"));
    // LoRA r16 on the seven projections: f32 A and B, their gradients and two AdamW moments.
    ASSERT_TRUE(add_lora(**model, LoraConfig{}, 1).ok());
    int64_t lora = 0;
    for (const auto& [name, v] : lora_parameters(**model))
      if (name.find("layers.0.") != std::string::npos) lora += v->value().numel();
    EXPECT_EQ(units[1].state_bytes, 16 * lora) << family;
  }
}

ModelConfig eight_layers() {
  auto c = ModelConfig::from_json_text(R"({"model_type": "llama", "vocab_size": 1000, "hidden_size": 256,
      "intermediate_size": 512, "num_hidden_layers": 8, "num_attention_heads": 4})", "test");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(DevicePlan, SequentialFillsEachDeviceInTurnAndBalancedSplitsEvenly) {
  const std::vector<PlanUnit> units = plan_units(eight_layers(), {});
  int64_t layer = units[1].bytes(), total = 0;
  for (const PlanUnit& u : units) total += u.bytes();
  MemoryCaps caps;
  caps.gpu = {{0, units[0].bytes() + 3 * layer}, {1, 100 * layer}};
  caps.cpu = 0;
  auto seq = plan_devices(units, "sequential", caps, 2, {}, 0);
  ASSERT_TRUE(seq.ok()) << seq.status();
  // cuda:0 takes the embedding and three layers, cuda:1 the rest; never back to an earlier device.
  for (size_t i = 0; i < units.size(); ++i)
    EXPECT_EQ(seq->placement[i].second, i <= 3 ? Device::cuda(0) : Device::cuda(1)) << units[i].name;
  caps.gpu = {{0, 100 * layer}, {1, 100 * layer}};
  auto bal = plan_devices(units, "auto", caps, 2, {}, 0);
  ASSERT_TRUE(bal.ok()) << bal.status();
  EXPECT_EQ(bal->strategy, "balanced");
  const int64_t a = bal->bytes.at("cuda:0"), b = bal->bytes.at("cuda:1");
  EXPECT_EQ(a + b, total);
  EXPECT_LE(std::abs(a - b), 2 * std::max(layer, units[0].bytes())) << a << " " << b;
  // One GPU: auto is sequential.
  caps.gpu.erase(1);
  auto one = plan_devices(units, "auto", caps, 1, {}, 0);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->strategy, "sequential");
}

TEST(DevicePlan, LayersPastTheGpuCapAreStreamedFromHostMemory) {
  const std::vector<PlanUnit> units = plan_units(eight_layers(), {});
  const int64_t layer = units[1].bytes(), working = layer / 2;
  const int64_t tail = units[9].bytes() + units[10].bytes();
  // Room for the embedding, the final norm and lm_head, two layers, and what six streamed layers
  // keep on the GPU: their LoRA state and activations, and two staging slots of one layer's weights.
  const int64_t streamed_rest = 6 * (units[1].state_bytes + units[1].activation_bytes);
  MemoryCaps caps;
  caps.gpu = {{0, working + units[0].bytes() + 2 * layer + tail + streamed_rest + 2 * units[1].weight_bytes}};
  auto plan = plan_devices(units, "sequential", caps, 1, {{"cpu", 64 * kGiB}}, working);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->placement[2].second, Device::cuda(0));
  EXPECT_EQ(plan->placement[3].second, Device::cpu());
  EXPECT_EQ(plan->placement[8].second, Device::cpu());
  EXPECT_EQ(plan->placement[9].second, Device::cuda(0)) << "the final norm stays on the GPU";
  EXPECT_EQ(plan->placement.back().second, Device::cuda(0)) << "lm_head stays on the GPU";
  EXPECT_EQ(plan->stream_slot_bytes, 2 * units[1].weight_bytes);
  EXPECT_EQ(plan->bytes.at("cuda:0"), caps.gpu.at(0));
  EXPECT_EQ(plan->bytes.at("cpu"), 6 * units[1].weight_bytes);
  const std::string text = plan->describe(caps);
  EXPECT_NE(text.find("cuda:0: embedding, layers 0-1, final norm, lm_head"), std::string::npos) << text;
  EXPECT_NE(text.find("cpu: layers 2-7"), std::string::npos) << text;
  EXPECT_NE(text.find("streamed to the GPU a layer ahead"), std::string::npos) << text;
  EXPECT_NE(text.find("two staging buffers"), std::string::npos) << text;
  EXPECT_EQ(plan->to_json()["model.layers.1"], 0);
  EXPECT_EQ(plan->to_json()["model.layers.2"], "cpu");
  // What the model loads with: the layers on "cpu" run on cuda:0, streamed.
  const Placement p = plan->to_placement();
  EXPECT_EQ(p.layers[2], Device::cuda(0));
  EXPECT_TRUE(p.streamed[2]);
  EXPECT_FALSE(p.streamed[1]);
  // One byte less on the GPU: one more layer streams.
  caps.gpu[0] -= 1;
  plan = plan_devices(units, "sequential", caps, 1, {{"cpu", 64 * kGiB}}, working);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->placement[2].second, Device::cpu());
  // A CPU run: everything on the CPU, nothing streamed.
  plan = plan_devices(units, "auto", {}, 0, {{"cpu", 64 * kGiB}}, working);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->to_placement().any_streamed());
  EXPECT_EQ(plan->describe({}).find("streamed"), std::string::npos);
}

// A tied lm_head is the embedding: it goes where the embedding is, over two GPUs and under a map.
TEST(DevicePlan, ATiedHeadStaysWithItsEmbedding) {
  auto c = ModelConfig::from_json_text(R"({"model_type": "llama", "vocab_size": 1000, "hidden_size": 256,
      "intermediate_size": 512, "num_hidden_layers": 8, "num_attention_heads": 4, "tie_word_embeddings": true})", "test");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<PlanUnit> units = plan_units(*c, {});
  ASSERT_TRUE(units.back().tied_to_embedding);
  MemoryCaps caps;
  caps.gpu = {{0, 100 * units[1].bytes()}, {1, 100 * units[1].bytes()}};
  auto plan = plan_devices(units, "balanced", caps, 2, {}, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->placement[9].second, Device::cuda(1)) << "the final norm follows the last layers";
  EXPECT_EQ(plan->placement.back().second, Device::cuda(0)) << "the tied head is the embedding";
  const Placement p = plan->to_placement();
  EXPECT_EQ(p.head, p.embed);
}

TEST(DevicePlan, TheEmbeddingNormAndHeadStayOnAGpu) {
  const std::vector<PlanUnit> units = plan_units(eight_layers(), {});
  const std::string dir = ::testing::TempDir() + "loom_device_map_gpu_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/map.json") << R"({"": 0, "lm_head": "cpu"})";
  auto plan = plan_devices(units, dir + "/map.json", {}, 1, {}, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(std::string(plan.status().message()).find("lm_head is mapped to \"cpu\""), std::string::npos) << plan.status();
}

TEST(DevicePlan, ARunThatCannotFitSaysWhatWould) {
  const std::vector<PlanUnit> units = plan_units(eight_layers(), {});
  MemoryCaps caps;
  caps.gpu = {{0, units[1].bytes()}};
  caps.cpu = units[1].bytes();
  auto plan = plan_devices(units, "balanced", caps, 1, {}, 0);
  ASSERT_FALSE(plan.ok());
  const std::string m(plan.status().message());
  for (const char* s : {"does not fit", "weights", "trainable state", "--max-memory", "--qlora", "--checkpointing offload"})
    EXPECT_NE(m.find(s), std::string::npos) << s << ": " << m;
}

TEST(DevicePlan, AccelerateDeviceMapFilesAndMaxMemory) {
  const std::vector<PlanUnit> units = plan_units(eight_layers(), {});
  const std::string dir = ::testing::TempDir() + "loom_device_map_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& text) {
    std::ofstream(dir + "/map.json") << text;
    return dir + "/map.json";
  };
  // The longest dotted prefix decides: "model.layers" sends every layer to GPU 1, layer 7 to the CPU.
  auto plan = plan_devices(units, write(R"({"model": 0, "model.layers": 1, "model.layers.7": "cpu", "lm_head": "cuda:0"})"),
                           {}, 2, {}, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->placement[0].second, Device::cuda(0));
  EXPECT_EQ(plan->placement[1].second, Device::cuda(1));
  EXPECT_EQ(plan->placement[8].second, Device::cpu());
  EXPECT_EQ(plan->placement[9].second, Device::cuda(0));  // model.norm under "model"
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model.layers.0": 0})", "no device for model.embed_tokens"},
           {R"({"": 0, "model.layer.3": 1})", "names no part of the model"},
           {R"({"": 2})", "but 2 GPU(s) are visible"},
           {R"({"": "disk"})", "not from disk"},
           {R"({"": true})", "is not a device"}}) {
    auto bad = plan_devices(units, write(text), {}, 2, {}, 0);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(std::string(bad.status().message()).find(says), std::string::npos) << bad.status();
  }
  auto caps = parse_max_memory("cuda:0=20GiB, 1=500MB,cpu=1.5TB");
  ASSERT_TRUE(caps.ok()) << caps.status();
  EXPECT_EQ(caps->gpu.at(0), 20 * kGiB);
  EXPECT_EQ(caps->gpu.at(1), 500000000);
  EXPECT_EQ(*caps->cpu, 1500000000000);
  for (const char* bad : {"cuda:0", "gpu0=1GB", "cuda:0=1GB,cuda:0=2GB", "cpu=12 parsecs", "cpu=-1GB"})
    EXPECT_FALSE(parse_max_memory(bad).ok()) << bad;
}

}  // namespace
}  // namespace loom
