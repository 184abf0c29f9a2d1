// Where each part of a CausalLM lives and runs (`--device-map`; train/device_plan.h makes it from
// measured bytes): the embedding, each decoder layer, the final norm and lm_head on a device of
// their own, and decoder layers whose frozen weights stay in host memory and are streamed to their
// device one layer ahead (models/layer_streamer.h). Activations hop between devices where two
// neighbours differ (ag::to_device); each layer's LoRA adapters live where it runs. Checkpoints do
// not depend on it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/device.h"

namespace loom {

struct Placement {
  Device embed, norm, head;
  std::vector<Device> layers;   // the device each decoder layer runs on
  std::vector<bool> streamed;   // its frozen weights in host memory, copied to layers[i] as it runs

  // Everything on one device, nothing streamed.
  static Placement uniform(Device d, int64_t num_layers) {
    Placement p;
    p.embed = p.norm = p.head = d;
    p.layers.assign(static_cast<size_t>(num_layers), d);
    p.streamed.assign(static_cast<size_t>(num_layers), false);
    return p;
  }
  bool any_streamed() const {
    for (bool s : streamed)
      if (s) return true;
    return false;
  }
  // The device a module runs on, by its Hugging Face name ("model.layers.3.mlp.down_proj", "lm_head").
  Device device_of(const std::string& module) const;
  // The GPUs the model runs on, each once, in model order.
  std::vector<Device> gpus() const;
};

}  // namespace loom
