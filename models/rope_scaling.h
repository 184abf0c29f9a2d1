// RoPE as a model's config.json sets it: the base and transformers' scaling kinds (`rope_scaling` in
// 4.x, `rope_parameters` in 5.x), and the inv_freq table each produces. Kernels see only the table.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace loom {

// Mirrors transformers' `rope_scaling` / `rope_parameters` for the kinds Loom supports.
struct RopeScaling {
  enum class Kind { kDefault, kLinear, kLlama3, kLongRope } kind = Kind::kDefault;
  double factor = 1;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  double original_max_position_embeddings = 8192;
  // LongRoPE (Phi-3 `longrope`, legacy `su`): per-frequency divisors of the table, the short ones for
  // sequences up to original_max_position_embeddings and the long ones beyond (chosen per forward
  // from the largest position, as transformers does), and the scaling of cos and sin.
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1;
};

// The RoPE of one layer type: its base (`rope_theta`), scaling and the rotated share of a head.
struct RopeParams {
  double theta = 10000;
  RopeScaling scaling;
  double partial_rotary_factor = 1;  // rotary_dim = int(head_dim * this) (Phi-4-mini: 0.75)
  bool operator==(const RopeParams& o) const {
    return theta == o.theta && partial_rotary_factor == o.partial_rotary_factor && scaling.kind == o.scaling.kind &&
           scaling.factor == o.scaling.factor && scaling.low_freq_factor == o.scaling.low_freq_factor &&
           scaling.high_freq_factor == o.scaling.high_freq_factor &&
           scaling.original_max_position_embeddings == o.scaling.original_max_position_embeddings &&
           scaling.short_factor == o.scaling.short_factor && scaling.long_factor == o.scaling.long_factor &&
           scaling.attention_factor == o.scaling.attention_factor;
  }
  // The rotated leading dims of a head: int(head_dim * partial_rotary_factor), as transformers.
  int64_t rotary_dim(int64_t head_dim) const;
  // LongRoPE: whether a forward whose largest position is max_position uses the long factors.
  bool uses_long_factors(int64_t max_position) const {
    return scaling.kind == RopeScaling::Kind::kLongRope && max_position + 1 > scaling.original_max_position_embeddings;
  }
  float mscale() const { return scaling.kind == RopeScaling::Kind::kLongRope ? float(scaling.attention_factor) : 1.f; }
};

// inv_freq [rotary_dim / 2] as transformers computes it in float32 on the CPU (same op sequence): the
// default table 1 / theta^(2i / rotary_dim), then the scaling rule (`_compute_llama3_parameters` for
// kLlama3; LongRoPE's 1 / (factor_i * theta^(2i / rotary_dim)) with the short or `long_factors`).
std::vector<float> rope_inv_freq(int64_t head_dim, const RopeParams& rope, bool long_factors = false);
// The same as an f32 tensor on `device`.
Tensor rope_inv_freq_tensor(int64_t head_dim, const RopeParams& rope, Device device, bool long_factors = false);

const char* rope_kind_name(RopeScaling::Kind kind);  // "default", "linear", "llama3", "longrope"

}  // namespace loom
