// NF4 4-bit weights exactly as bitsandbytes 0.50 stores them (quantize_4bit, quant_type "nf4",
// blocksize 64, compress_statistics=True): the 16-value code book, one f32 absmax per block of 64,
// two codes per byte (element 2j in the high nibble), and the absmax double-quantised.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/common.h"

namespace loom {

inline constexpr int kNf4Block = 64;         // elements per absmax
inline constexpr int kNf4NestedBlock = 256;  // absmax values per second-level absmax
inline constexpr int64_t nf4_blocks(int64_t n) { return (n + kNf4Block - 1) / kNf4Block; }
inline constexpr int64_t nf4_nested_blocks(int64_t n) { return (nf4_blocks(n) + kNf4NestedBlock - 1) / kNf4NestedBlock; }
inline constexpr int64_t nf4_packed_bytes(int64_t n) { return (n + 1) / 2; }

// bitsandbytes' NF4 code book (get_4bit_type("nf4") and the CUDA nf4_dequantization_lut), in code
// order; the literals round to the same f32 values as torch.tensor(data) does.
#define LOOM_NF4_CODE                                                                                  \
  {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,    \
   -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,     \
   0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,              \
   0.7229568362236023f, 1.0f}
inline constexpr float kNf4Code[16] = LOOM_NF4_CODE;

// dQuantizeNF4: bitsandbytes' decision tree over x = value * (1 / absmax). Its thresholds are
// the midpoints of neighbouring codes; NaN (0 * inf in an all-zero block) falls through to 0.
LOOM_HD uint8_t nf4_code_of(float x) {
  if (x > 0.03979014977812767f) {
    if (x > 0.3893125355243683f) {
      if (x > 0.6427869200706482f) return x > 0.8614784181118011f ? 0b1111 : 0b1110;
      return x > 0.5016634166240692f ? 0b1101 : 0b1100;
    }
    if (x > 0.2035212516784668f) return x > 0.2920137718319893f ? 0b1011 : 0b1010;
    return x > 0.1202552504837513f ? 0b1001 : 0b1000;
  }
  if (x > -0.33967943489551544f) {
    if (x > -0.13791173323988914f) return x > -0.045525018125772476f ? 0b0111 : 0b0110;
    return x > -0.23460740596055984f ? 0b0101 : 0b0100;
  }
  if (x > -0.6106329262256622f) return x > -0.4599952697753906f ? 0b0011 : 0b0010;
  return x > -0.8480964004993439f ? 0b0001 : 0b0000;
}

// dQuantize<0> (quantize_blockwise's code search, used for the nested absmax): binary search of x
// in a sorted 256-entry code, then the nearer neighbour by the f32 midpoint; ties go to the pivot.
LOOM_HD uint8_t blockwise_code_of(const float* code, float x) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.f, upper = 1.f, val = code[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = code[pivot];
  }
  if (upper_pivot == 255) upper = code[upper_pivot];
  if (lower_pivot == 0) lower = code[lower_pivot];
  if (x > val) return static_cast<uint8_t>(x > (upper + val) * 0.5f ? upper_pivot : pivot);
  return static_cast<uint8_t>(x < (lower + val) * 0.5f ? lower_pivot : pivot);
}

// The NF4 state of one tensor as the dequantise kernels read it: either plain f32 absmax
// (compress_statistics=False) or the double-quantised form absmax[b] =
// nested_code[qabsmax[b]] * nested_absmax[b / 256] + offset (two f32 roundings, as bitsandbytes'
// dequantize_blockwise followed by `absmax += offset`).
struct Nf4State {
  const float* absmax = nullptr;          // [blocks] f32, or null when double-quantised
  const uint8_t* qabsmax = nullptr;       // [blocks] codes of nested_code
  const float* nested_absmax = nullptr;   // [nested blocks]
  const float* nested_code = nullptr;     // [256] (bitsandbytes' signed dynamic map)
  float offset = 0.f;
};

LOOM_HD float nf4_block_absmax(const Nf4State& s, int64_t b) {
  if (s.absmax) return s.absmax[b];
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(s.nested_code[s.qabsmax[b]], s.nested_absmax[b / kNf4NestedBlock]), s.offset);
#else
  const float scaled = s.nested_code[s.qabsmax[b]] * s.nested_absmax[b / kNf4NestedBlock];
  return scaled + s.offset;  // two roundings (loom_kernels builds with -ffp-contract=off)
#endif
}

}  // namespace loom

// Quantisation, in bitsandbytes' order:
//   nf4_quantize: per block of 64 (the last one padded with zeros): absmax = max |x| (f32),
//     inv = 1.0f / absmax (IEEE; bitsandbytes builds with --use_fast_math, whose reciprocal is
//     within 1 ulp: see tests/kernels/test_nf4_cpu.cpp), packed[j] = code(x[2j] * inv) << 4 |
//     code(x[2j+1] * inv) (a missing odd last element counts as 0).
//   nf4_absmax_mean: the offset, mean of the absmax values (f64 sums over chunks of 1024 in index
//     order, then over the chunks; rounded once to f32: bitsandbytes takes torch's CUDA f32 mean,
//     whose summation order is its own, so the offsets may differ in the last bits).
//   nf4_double_quantize: per block of 256 absmax values: a = absmax - offset (f32), nested_absmax
//     = max |a|, qabsmax = blockwise_code_of(code, a * (1.0f / nested_absmax)).
// Dequantisation: out[i] = kNf4Code[nibble(i)] * nf4_block_absmax(state, i / 64), in f32, rounded
// once to T.
namespace loom::cpu {
template <class T>
void nf4_quantize(const T* x, int64_t n, uint8_t* packed, float* absmax);
float nf4_absmax_mean(const float* absmax, int64_t blocks);
void nf4_double_quantize(const float* absmax, int64_t blocks, float offset, const float* code, uint8_t* qabsmax,
                         float* nested_absmax);
template <class T>
void nf4_dequantize(const uint8_t* packed, const Nf4State& state, int64_t n, T* out);
}  // namespace loom::cpu

namespace loom::cuda {
// Device pointers throughout; `offset_out` (one f32 on the device) receives the mean, and
// nf4_double_quantize reads it from the device, so quantising never waits on the host.
template <class T>
void nf4_quantize(const T* x, int64_t n, uint8_t* packed, float* absmax, Stream s);
void nf4_absmax_mean(const float* absmax, int64_t blocks, float* offset_out, Stream s);
void nf4_double_quantize(const float* absmax, int64_t blocks, const float* offset, const float* code,
                         uint8_t* qabsmax, float* nested_absmax, Stream s);
// The Nf4State's pointers are device pointers (offset a host value).
template <class T>
void nf4_dequantize(const uint8_t* packed, const Nf4State& state, int64_t n, T* out, Stream s);
// Several tensors of n elements each, quantised one by one (a mixture-of-experts projection's
// experts): one launch per 64 of them when they are whole 1024-element tiles with the vector
// kernel's alignments and one kind of state, else nf4_dequantize each. The same bits either way.
template <class T>
void nf4_dequantize_experts(const std::vector<const uint8_t*>& packed, const std::vector<Nf4State>& states, int64_t n,
                            const std::vector<T*>& out, Stream s);
}  // namespace loom::cuda
