// CPU reference for the counter-based fills (kernels/philox.h).
#include "kernels/philox.h"

namespace loom::cpu {
namespace {

// Writes the up-to-4 elements of block j (elements 4j .. 4j+3 that are < n).
template <class T, class F>
void for_each_block(T* out, int64_t n, F&& block_values) {
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for if (n > 65536)
  for (int64_t j = 0; j < blocks; ++j) {
    float v[4];
    block_values(j, v);
    for (int lane = 0; lane < 4 && 4 * j + lane < n; ++lane) out[4 * j + lane] = from_acc<T>(static_cast<Acc<T>>(v[lane]));
  }
}

}  // namespace

template <class T>
void uniform_fill(T* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi) {
  LOOM_CHECK(n >= 0, "uniform_fill: n = ", n);
  LOOM_CHECK(n == 0 || out != nullptr, "uniform_fill: null output");
  for_each_block(out, n, [&](int64_t j, float* v) {
    const Philox4 x = philox_block(seed, offset + static_cast<uint64_t>(j));
    for (int lane = 0; lane < 4; ++lane) v[lane] = philox_uniform(x.v[lane], lo, hi);
  });
}

template <class T>
void normal_fill(T* out, int64_t n, uint64_t seed, uint64_t offset, float mean, float std) {
  LOOM_CHECK(n >= 0, "normal_fill: n = ", n);
  LOOM_CHECK(n == 0 || out != nullptr, "normal_fill: null output");
  for_each_block(out, n, [&](int64_t j, float* v) {
    const Philox4 x = philox_block(seed, offset + static_cast<uint64_t>(j));
    philox_normal_pair(x, 0, mean, std, v);
    philox_normal_pair(x, 1, mean, std, v + 2);
  });
}

template void uniform_fill<float>(float*, int64_t, uint64_t, uint64_t, float, float);
template void uniform_fill<double>(double*, int64_t, uint64_t, uint64_t, float, float);
template void uniform_fill<bf16>(bf16*, int64_t, uint64_t, uint64_t, float, float);
template void normal_fill<float>(float*, int64_t, uint64_t, uint64_t, float, float);
template void normal_fill<double>(double*, int64_t, uint64_t, uint64_t, float, float);
template void normal_fill<bf16>(bf16*, int64_t, uint64_t, uint64_t, float, float);

}  // namespace loom::cpu
