// CPU reference for kernels/lora_dy.h: dt row by row, db a range of dy's columns per thread (every
// row walked for its range), so that each output is one thread's f32 sum in row order.
#include "kernels/lora_dy.h"

#include <vector>

namespace loom::cpu {

void lora_dy_products(const bf16* dy, int64_t ld_dy, const bf16* b, int64_t ld_b, const bf16* t, int64_t ld_t,
                      int64_t n, int64_t out, int64_t r, int m, float alpha, float* dt, float* db) {
  LOOM_CHECK(n >= 0 && out >= 0 && r >= 1 && m >= 1 && ld_dy >= out && ld_b >= m * r && ld_t >= m * r,
             "lora_dy_products: n ", n, ", out ", out, ", r ", r, ", m ", m, " with pitches ", ld_dy, ", ", ld_b, ", ",
             ld_t);
  // B's and t's blocks summed first, in f32 (each product is exact in f32: bf16 x bf16).
  std::vector<float> bsum(out * r), tsum(n * r);
  auto sum_blocks = [&](const bf16* x, int64_t ld, int64_t rows, float* to) {
#pragma omp parallel for if (rows * r > 65536)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < r; ++j) {
        float s = 0.f;
        for (int p = 0; p < m; ++p) s += bf16_to_float(x[i * ld + p * r + j]);
        to[i * r + j] = s;
      }
  };
  sum_blocks(b, ld_b, out, bsum.data());
  sum_blocks(t, ld_t, n, tsum.data());
#pragma omp parallel for if (n * out > 65536)
  for (int64_t i = 0; i < n; ++i) {
    float* row = dt + i * r;
    for (int64_t j = 0; j < r; ++j) row[j] = 0.f;
    for (int64_t o = 0; o < out; ++o) {
      const float g = bf16_to_float(dy[i * ld_dy + o]);
      for (int64_t j = 0; j < r; ++j) row[j] += g * bsum[o * r + j];
    }
  }
  constexpr int64_t kCols = 64;  // one thread's columns of dy at a time
#pragma omp parallel for if (n * out > 65536)
  for (int64_t c0 = 0; c0 < out; c0 += kCols) {
    const int64_t c1 = c0 + kCols < out ? c0 + kCols : out;
    std::vector<float> acc((c1 - c0) * r, 0.f);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t o = c0; o < c1; ++o) {
        const float g = bf16_to_float(dy[i * ld_dy + o]);
        for (int64_t j = 0; j < r; ++j) acc[(o - c0) * r + j] += g * tsum[i * r + j];
      }
    for (int64_t k = 0; k < (c1 - c0) * r; ++k) db[c0 * r + k] = alpha * acc[k];
  }
}

}  // namespace loom::cpu
