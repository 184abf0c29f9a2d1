// CPU reference NF4 quantise / double-quantise / dequantise (kernels/nf4.h), in bitsandbytes'
// operation order; the CUDA kernels agree with it bit for bit.
#include "kernels/nf4.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kernels/error.h"

namespace loom::cpu {

template <class T>
void nf4_quantize(const T* x, int64_t n, uint8_t* packed, float* absmax) {
  LOOM_CHECK(n >= 0, "nf4_quantize: n = ", n);
  const int64_t blocks = nf4_blocks(n);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kNf4Block, hi = std::min(n, lo + kNf4Block);
    float m = hi - lo < kNf4Block ? 0.f : -FLT_MAX;  // bitsandbytes' zero padding takes part in the max
    for (int64_t i = lo; i < hi; ++i) m = std::fmax(m, std::fabs(static_cast<float>(to_acc(x[i]))));
    absmax[b] = m;
    const float inv = 1.0f / m;
    for (int64_t i = lo; i < hi; i += 2) {
      const float a = static_cast<float>(to_acc(x[i]));
      const float c = i + 1 < n ? static_cast<float>(to_acc(x[i + 1])) : 0.f;  // bitsandbytes pads with 0
      packed[i / 2] = static_cast<uint8_t>(nf4_code_of(a * inv) << 4 | nf4_code_of(c * inv));
    }
  }
}

float nf4_absmax_mean(const float* absmax, int64_t blocks) {
  LOOM_CHECK(blocks > 0, "nf4_absmax_mean: no blocks");
  constexpr int64_t kChunk = 1024;  // the CUDA kernel sums the same chunks in the same order
  double total = 0;
  for (int64_t c = 0; c < blocks; c += kChunk) {
    double part = 0;
    for (int64_t i = c; i < std::min(blocks, c + kChunk); ++i) part += absmax[i];
    total += part;
  }
  return static_cast<float>(total / static_cast<double>(blocks));
}

void nf4_double_quantize(const float* absmax, int64_t blocks, float offset, const float* code, uint8_t* qabsmax,
                         float* nested_absmax) {
  LOOM_CHECK(blocks >= 0, "nf4_double_quantize: blocks = ", blocks);
  const int64_t nested = (blocks + kNf4NestedBlock - 1) / kNf4NestedBlock;
#pragma omp parallel for schedule(static)
  for (int64_t nb = 0; nb < nested; ++nb) {
    const int64_t lo = nb * kNf4NestedBlock, hi = std::min(blocks, lo + kNf4NestedBlock);
    float m = hi - lo < kNf4NestedBlock ? 0.f : -FLT_MAX;
    for (int64_t b = lo; b < hi; ++b) m = std::fmax(m, std::fabs(absmax[b] - offset));
    nested_absmax[nb] = m;
    const float inv = 1.0f / m;
    for (int64_t b = lo; b < hi; ++b) qabsmax[b] = blockwise_code_of(code, (absmax[b] - offset) * inv);
  }
}

template <class T>
void nf4_dequantize(const uint8_t* packed, const Nf4State& state, int64_t n, T* out) {
  LOOM_CHECK(n >= 0, "nf4_dequantize: n = ", n);
  LOOM_CHECK(state.absmax || (state.qabsmax && state.nested_absmax && state.nested_code),
             "nf4_dequantize: the state has neither absmax nor the nested (qabsmax, nested_absmax, code) triple");
  const int64_t blocks = nf4_blocks(n);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const float a = nf4_block_absmax(state, b);
    const int64_t lo = b * kNf4Block, hi = std::min(n, lo + kNf4Block);
    for (int64_t i = lo; i < hi; ++i) {
      const uint8_t byte = packed[i / 2];
      out[i] = from_acc<T>(kNf4Code[(i & 1) ? (byte & 0x0f) : (byte >> 4)] * a);
    }
  }
}

template void nf4_quantize<float>(const float*, int64_t, uint8_t*, float*);
template void nf4_quantize<bf16>(const bf16*, int64_t, uint8_t*, float*);
template void nf4_dequantize<float>(const uint8_t*, const Nf4State&, int64_t, float*);
template void nf4_dequantize<bf16>(const uint8_t*, const Nf4State&, int64_t, bf16*);

}  // namespace loom::cpu
