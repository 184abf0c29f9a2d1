// Shared by the streaming tests (test_layer_streamer*.cpp): a fixture copied to five layers, LoRA on
// it (B drawn away from zero so that A's gradients count), two micro-batches of loss and backward,
// and a greedy generation, with or without layers streamed from host memory.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <map>
#include <optional>

#include "models/causal_lm.h"
#include "models/generate.h"
#include "models/layer_streamer.h"
#include "models/lora.h"
#include "tests/models/fixtures.h"

namespace loom::test {

constexpr int64_t kStreamLayers = 5;

struct StreamRun {
  std::vector<double> losses;
  std::map<std::string, Tensor> grads;
  int64_t copies = 0;
  std::vector<int32_t> generated;
};

inline Placement streaming(int64_t first_streamed, Device d = Device::cpu()) {
  Placement p = Placement::uniform(d, kStreamLayers);
  for (int64_t i = first_streamed; i < kStreamLayers; ++i) p.streamed[i] = true;
  return p;
}

inline StreamRun train_streamed(const std::string& dir, bool qlora, std::optional<Placement> placement, Checkpointing mode,
                                Device device = Device::cpu(), DType dtype = DType::f32) {
  StreamRun out;
  LoadOptions lo{dtype, device};
  lo.quantize_4bit = qlora;
  lo.placement = placement;
  lo.adapter_room = 3 * LoraConfig{}.r + 1;  // as `loom train` loads for LoRA (the one-GEMM product in bf16)
  auto model = CausalLM::load(dir, lo);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return out;
  EXPECT_TRUE(add_lora(**model, LoraConfig{}, 7).ok());
  uint64_t k = 0;
  for (auto& [name, v] : lora_parameters(**model)) {  // B away from zero, so that A's gradients count too
    Tensor t = v->value();
    if (name.find("lora_B") != std::string::npos) ops::uniform_(t, 11, ++k << 32, -0.05f, 0.05f);
  }
  (*model)->set_checkpointing(mode);
  auto in = read_all(dir + "/inputs.safetensors");
  for (int micro = 0; micro < 2; ++micro) {
    ag::Variable loss = (*model)->loss(in["input_ids"], in["labels"]);
    out.losses.push_back(loss.value().to_doubles()[0]);
    ag::backward(loss);
  }
  for (auto& [name, v] : lora_parameters(**model)) out.grads[name] = v->grad().to(Device::cpu());
  if ((*model)->streamer()) out.copies = (*model)->streamer()->copies();
  GenerateOptions g;
  g.max_new_tokens = 6;
  g.temperature = 0;
  out.generated = generate(**model, {1, 5, 9, 2}, g);
  return out;
}

// A copy of `variant` with five layers (and its inputs) in a fresh folder under the test temp dir.
inline std::string five_layer_copy(const std::string& variant, const std::string& tag) {
  const std::string dir = ::testing::TempDir() + "loom_stream_" + tag + variant + "_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  copy_fixture(variant, dir, {{"layer_types", nullptr}}, kStreamLayers);  // the fixtures list two layers' types
  std::filesystem::copy_file(fixture_dir(variant) + "/inputs.safetensors", dir + "/inputs.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  return dir;
}

}  // namespace loom::test
