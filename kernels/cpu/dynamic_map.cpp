// create_dynamic_map as bitsandbytes computes it with PyTorch's f32 CPU kernels (dynamic_map.h).
#include "kernels/dynamic_map.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/error.h"

namespace loom {
namespace {

// torch.linspace(start, end, steps, dtype=float32) on the CPU (RangeFactoriesKernel.cpp):
// step = (end - start) / (steps - 1) in f32; element j is start + step*j below steps/2 and
// end - step*(steps-1-j) from there on. cpu_serial_kernel_vec fills 2*W elements per iteration
// with two Vectorized::arange(base, step) = {base, base + 1*step, ..., base + (W-1)*step}, each
// base from the scalar formula at its first index; the remaining elements take the scalar formula.
std::vector<float> torch_linspace(float start, float end, int64_t steps, int vec) {
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t half = steps / 2;
  auto scalar = [&](int64_t j) {
    return j < half ? start + step * static_cast<float>(j) : end - step * static_cast<float>(steps - j - 1);
  };
  std::vector<float> out;
  int64_t j = 0;
  if (vec > 0)
    for (; j + 2 * vec <= steps; j += 2 * vec)
      for (int c = 0; c < 2; ++c) {
        const float base = scalar(j + c * vec);
        for (int k = 0; k < vec; ++k) out.push_back(k == 0 ? base : base + static_cast<float>(k) * step);
      }
  for (; j < steps; ++j) out.push_back(scalar(j));
  return out;
}

}  // namespace

void dynamic_map(bool is_signed, float out[256], int torch_vec_width) {
  LOOM_CHECK(torch_vec_width == 0 || torch_vec_width == 8 || torch_vec_width == 16,
             "dynamic_map: torch_vec_width must be 0, 8 or 16, got ", torch_vec_width);
  constexpr int kMaxExponentBits = 7, kNonSignBits = 7;  // total_bits 8 minus the sign bit
  std::vector<float> data;
  for (int i = 0; i < kMaxExponentBits; ++i) {
    const int64_t items = (int64_t{1} << (i + kNonSignBits - kMaxExponentBits + (is_signed ? 0 : 1))) + 1;
    const std::vector<float> b = torch_linspace(0.1f, 1.f, items, torch_vec_width);
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
