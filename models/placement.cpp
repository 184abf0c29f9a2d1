// See placement.h.
#include "models/placement.h"

#include <algorithm>
#include <cstdlib>

namespace loom {

Device Placement::device_of(const std::string& module) const {
  // Loom's and PEFT's names alike ("base_model.model.model.layers.3.mlp.down_proj.lora_A.weight").
  static const std::string kLayers = "model.layers.";
  if (const size_t at = module.find(kLayers); at != std::string::npos) {
    const size_t i = std::strtoull(module.c_str() + at + kLayers.size(), nullptr, 10);
    if (i < layers.size()) return layers[i];
  }
  if (module.find("lm_head") != std::string::npos) return head;
  if (module.find("model.norm") != std::string::npos) return norm;
  return embed;
}

std::vector<Device> Placement::gpus() const {
  std::vector<Device> out;
  auto add = [&](const Device& d) {
    if (d.is_cuda() && std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  };
  add(embed);
  for (const Device& d : layers) add(d);
  add(norm);
  add(head);
  return out;
}

}  // namespace loom
