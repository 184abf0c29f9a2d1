// Shared by every kernel, CPU and CUDA: the bf16 storage type with round-to-nearest-even
// conversions, host/device qualifiers, the opaque stream handle, and the accumulator type map.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/error.h"

#if defined(__CUDACC__)
#define LOOM_HD __host__ __device__ __forceinline__
#else
#define LOOM_HD inline
#endif

struct CUstream_st;  // cudaStream_t is CUstream_st*; headers stay free of CUDA includes.

namespace loom {

using Stream = CUstream_st*;

// bfloat16 as stored: the upper 16 bits of an IEEE float. Layout-identical to __nv_bfloat16.
struct bf16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2);

LOOM_HD float bf16_to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

LOOM_HD bf16 float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};  // quiet NaN stays NaN
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16{static_cast<uint16_t>(u >> 16)};
}

// Generic load/store in the compute type: every kernel reads T, computes in Acc<T>, writes T.
LOOM_HD float to_acc(float v) { return v; }
LOOM_HD double to_acc(double v) { return v; }
LOOM_HD float to_acc(bf16 v) { return bf16_to_float(v); }

template <class T>
LOOM_HD T from_acc(float v);
template <>
LOOM_HD float from_acc<float>(float v) { return v; }
template <>
LOOM_HD bf16 from_acc<bf16>(float v) { return float_to_bf16(v); }
template <class T>
LOOM_HD T from_acc(double v) { return static_cast<T>(v); }
template <>
LOOM_HD bf16 from_acc<bf16>(double v) { return float_to_bf16(static_cast<float>(v)); }

// max(a, b) that returns NaN when either is NaN (std::max and fmaxf drop a NaN, which lets a NaN
// score or logit vanish from a softmax instead of poisoning it). Softmax maxima use this.
template <class A>
LOOM_HD A nan_max(A a, A b) {
  return (a > b || a != a) ? a : b;
}

// Accumulator type: f64 kernels (CPU only, for finite-difference tests) accumulate in f64,
// everything else in f32.
template <class T>
struct AccT { using type = float; };
template <>
struct AccT<double> { using type = double; };
template <class T>
using Acc = typename AccT<T>::type;

}  // namespace loom
