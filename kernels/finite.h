// Finding NaN and infinity in a buffer: what model loading and every save check their tensors with.
// A bit test on the exponent (all ones), so it is exact and never trips on large finite values.
#pragma once
#include <cstdint>

#include "kernels/common.h"

namespace loom::cpu {
// The index of the first NaN or +-inf among x[0..n), or -1 when every element is finite. One pass,
// split over OpenMP threads for large buffers. f16 is given as its raw 16-bit patterns.
int64_t first_nonfinite(const float* x, int64_t n);
int64_t first_nonfinite(const double* x, int64_t n);
int64_t first_nonfinite(const bf16* x, int64_t n);
int64_t first_nonfinite_f16(const uint16_t* x, int64_t n);

// Copies n elements of `bytes_per` bytes (2, 4 or 8: f16/bf16, f32, f64) from src to dst and returns
// the first non-finite index as above: each chunk is tested in dst while it is still in cache, so
// loading a weight and checking it is one pass over memory. kind_f16 picks f16's exponent for 2 bytes.
int64_t copy_first_nonfinite(const void* src, void* dst, int64_t n, int bytes_per, bool kind_f16 = false);
}  // namespace loom::cpu
