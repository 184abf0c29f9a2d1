// create_dynamic_map as bitsandbytes computes it with PyTorch's f32 CPU kernels (dynamic_map.h).
#include "kernels/dynamic_map.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/error.h"

namespace loom {
namespace {

// torch.linspace(start, end, steps, dtype=float32) on the CPU as PyTorch's compiled kernel computes
// it: step = (end - start) / (steps - 1) in f32; element j is fma(step, j, start) below steps / 2
// and fma(-step, steps - 1 - j, end) from there on, each rounded once (the kernel is built with
// FMA contraction). Checked against torch 2.11 (AVX512, the GPU host) and 2.15 (this CPU machine)
// for every size the map uses: identical bits.
std::vector<float> torch_linspace(float start, float end, int64_t steps) {
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t half = steps / 2;
  std::vector<float> out(steps);
  for (int64_t j = 0; j < steps; ++j)
    out[j] = j < half ? std::fma(step, static_cast<float>(j), start)
                      : std::fma(-step, static_cast<float>(steps - 1 - j), end);
  return out;
}

}  // namespace

void dynamic_map(bool is_signed, float out[256]) {
  constexpr int kMaxExponentBits = 7, kNonSignBits = 7;  // total_bits 8 minus the sign bit
  std::vector<float> data;
  for (int i = 0; i < kMaxExponentBits; ++i) {
    const int64_t items = (int64_t{1} << (i + kNonSignBits - kMaxExponentBits + (is_signed ? 0 : 1))) + 1;
    const std::vector<float> b = torch_linspace(0.1f, 1.f, items);
    // 10 ** (i - 6) as Python computes it, rounded to f32 when multiplied into the f32 tensor.
    const float scale = static_cast<float>(std::pow(10.0, i - (kMaxExponentBits - 1)));
    for (int64_t j = 0; j + 1 < items; ++j) {
      const float mean = (b[j] + b[j + 1]) / 2.f;
      data.push_back(scale * mean);
      if (is_signed) data.push_back(-scale * mean);
    }
  }
  // additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1 = 0: none.
  data.push_back(0.f);
  data.push_back(1.f);
  LOOM_CHECK(data.size() == 256, "dynamic_map: built ", data.size(), " values, expected 256");
  std::sort(data.begin(), data.end());
  std::copy(data.begin(), data.end(), out);
}

}  // namespace loom
