// Dropout whose mask is never stored: element i is kept iff the Philox uniform of (seed, offset + i/4,
// lane i%4) is >= p, so backward regenerates the same mask. Kept elements are scaled by 1/(1-p).
#pragma once
#include <cstdint>

#include "kernels/common.h"
#include "kernels/philox.h"

namespace loom {
// The keep decision shared by CPU and CUDA (bit-identical: integer compare on the top 24 bits).
LOOM_HD bool dropout_keep(uint64_t seed, uint64_t offset, int64_t i, float p) {
  const Philox4 r = philox_block(seed, offset + static_cast<uint64_t>(i) / 4);
  return philox_unit_float(r.v[i % 4]) >= p;
}
}  // namespace loom

namespace loom::cpu {
// out = x * keep / (1 - p); also used for backward (dx = dy * keep / (1 - p)) with the same seed.
template <class T> void dropout(const T* x, T* out, int64_t n, float p, uint64_t seed, uint64_t offset);
}  // namespace loom::cpu

namespace loom::cuda {
template <class T> void dropout(const T* x, T* out, int64_t n, float p, uint64_t seed, uint64_t offset, Stream s);
}  // namespace loom::cuda
