// RoPE as a model's config.json sets it: the base and transformers' scaling kinds (`rope_scaling` in
// 4.x, `rope_parameters` in 5.x), and the inv_freq table each produces. Kernels see only the table.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace loom {

// Mirrors transformers' `rope_scaling` / `rope_parameters` for the kinds Loom supports.
struct RopeScaling {
  enum class Kind { kDefault, kLinear, kLlama3 } kind = Kind::kDefault;
  double factor = 1;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  double original_max_position_embeddings = 8192;
};

// The RoPE of one layer type: its base (`rope_theta`) and scaling.
struct RopeParams {
  double theta = 10000;
  RopeScaling scaling;
  bool operator==(const RopeParams& o) const {
    return theta == o.theta && scaling.kind == o.scaling.kind && scaling.factor == o.scaling.factor &&
           scaling.low_freq_factor == o.scaling.low_freq_factor && scaling.high_freq_factor == o.scaling.high_freq_factor &&
           scaling.original_max_position_embeddings == o.scaling.original_max_position_embeddings;
  }
};

// inv_freq [head_dim / 2] as transformers computes it in float32 on the CPU (same op sequence): the
// default table 1 / theta^(2i / head_dim), then the scaling rule (`_compute_llama3_parameters` for kLlama3).
std::vector<float> rope_inv_freq(int64_t head_dim, const RopeParams& rope);
// The same as an f32 tensor on `device`.
Tensor rope_inv_freq_tensor(int64_t head_dim, const RopeParams& rope, Device device);

const char* rope_kind_name(RopeScaling::Kind kind);  // "default", "linear", "llama3"

}  // namespace loom
