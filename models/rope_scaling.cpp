// The scaled RoPE tables (models/rope_scaling.h), reproducing transformers' float32 arithmetic.
#include "models/rope_scaling.h"

#include <cmath>
#include <numbers>

#include "kernels/rope.h"

namespace loom {

int64_t RopeParams::rotary_dim(int64_t head_dim) const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}

std::vector<float> rope_inv_freq(int64_t head_dim, const RopeParams& rope, bool long_factors) {
  const int64_t dim = rope.rotary_dim(head_dim);
  std::vector<float> inv = cpu::rope_inv_freq(dim, rope.theta);
  const RopeScaling& s = rope.scaling;
  switch (s.kind) {
    case RopeScaling::Kind::kLongRope: {
      // transformers: 1.0 / (ext_factors * base ** (arange(0, dim, 2).float() / dim)), in float32.
      const std::vector<double>& ext = long_factors ? s.long_factor : s.short_factor;
      LOOM_CHECK(static_cast<int64_t>(ext.size()) == dim / 2, "rope_inv_freq: ", ext.size(), " LongRoPE factors for ",
                 dim / 2, " frequencies");
      const float base = static_cast<float>(rope.theta);
      for (size_t i = 0; i < inv.size(); ++i) {
        const float expo = static_cast<float>(2 * i) / static_cast<float>(dim);
        inv[i] = 1.0f / (static_cast<float>(ext[i]) * std::pow(base, expo));
      }
      break;
    }
    case RopeScaling::Kind::kDefault:
      break;
    case RopeScaling::Kind::kLinear: {
      LOOM_CHECK(s.factor > 0, "rope_inv_freq: linear factor must be positive, got ", s.factor);
      const float f = static_cast<float>(s.factor);
      for (auto& v : inv) v = v / f;
      break;
    }
    case RopeScaling::Kind::kLlama3: {
      LOOM_CHECK(s.factor > 0 && s.high_freq_factor != s.low_freq_factor && s.low_freq_factor > 0 &&
                     s.high_freq_factor > 0 && s.original_max_position_embeddings > 0,
                 "rope_inv_freq: bad llama3 scaling (factor ", s.factor, ", low_freq_factor ", s.low_freq_factor,
                 ", high_freq_factor ", s.high_freq_factor, ", original_max_position_embeddings ",
                 s.original_max_position_embeddings, ")");
      // Python-side scalars are computed in double, then meet float32 tensors as float32. A python
      // scalar divided by a tensor is Tensor.__rtruediv__ = reciprocal() * scalar: two roundings.
      const double old_ctx = s.original_max_position_embeddings;
      const float low_wavelen = static_cast<float>(old_ctx / s.low_freq_factor);
      const float high_wavelen = static_cast<float>(old_ctx / s.high_freq_factor);
      const float two_pi = static_cast<float>(2 * std::numbers::pi);
      const float factor = static_cast<float>(s.factor);
      const float old_ctx_f = static_cast<float>(old_ctx);
      const float low = static_cast<float>(s.low_freq_factor);
      const float span = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
      for (auto& v : inv) {
        const float wavelen = (1.0f / v) * two_pi;                      // 2 * math.pi / inv_freq
        const float llama = wavelen > low_wavelen ? v / factor : v;
        const float ratio = (1.0f / wavelen) * old_ctx_f;               // old_context_len / wavelen
        const float smooth = (ratio - low) / span;
        const float a = (1.0f - smooth) * llama;
        const float b = smooth * llama;
        const float smoothed = a / factor + b;
        const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        v = medium ? smoothed : llama;
      }
      break;
    }
  }
  return inv;
}

Tensor rope_inv_freq_tensor(int64_t head_dim, const RopeParams& rope, Device device, bool long_factors) {
  std::vector<float> f = rope_inv_freq(head_dim, rope, long_factors);
  return Tensor::from_floats(f, {static_cast<int64_t>(f.size())}).to(device);
}

const char* rope_kind_name(RopeScaling::Kind k) {
  switch (k) {
    case RopeScaling::Kind::kDefault: return "default";
    case RopeScaling::Kind::kLinear: return "linear";
    case RopeScaling::Kind::kLlama3: return "llama3";
    case RopeScaling::Kind::kLongRope: return "longrope";
  }
  return "?";
}

}  // namespace loom
