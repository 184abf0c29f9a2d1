// Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11) as a host/device function,
// the bit-to-float maps, and the uniform / normal fills built on them (same numbers on CPU and CUDA).
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/common.h"

namespace loom {

struct Philox4 {
  uint32_t v[4];
};

namespace detail {
LOOM_HD uint32_t mulhi32(uint32_t a, uint32_t b) {
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
}
}  // namespace detail

// Philox4x32 with 10 rounds: 128-bit counter ctr, 64-bit key (k0, k1) -> 128 random bits.
LOOM_HD Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const uint32_t lo0 = kM0 * ctr.v[0], hi0 = detail::mulhi32(kM0, ctr.v[0]);
    const uint32_t lo1 = kM1 * ctr.v[2], hi1 = detail::mulhi32(kM1, ctr.v[2]);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
  }
  return ctr;
}

// Loom's stream convention: block j of stream (seed, offset) is Philox4x32-10 with
// counter = {lo32(offset + j), hi32(offset + j), 0, 0} and key = {lo32(seed), hi32(seed)}.
// Element i of a fill is lane i % 4 of block i / 4, so a fill of n elements consumes
// ceil(n / 4) counters: the next independent fill starts at offset + ceil(n / 4).
LOOM_HD Philox4 philox_block(uint64_t seed, uint64_t counter) {
  return philox4x32_10(Philox4{{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u}},
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// The top 24 bits as a float in [0, 1): (u >> 8) * 2^-24 (exact: no rounding anywhere).
LOOM_HD float philox_unit_float(uint32_t u) { return static_cast<float>(u >> 8) * 5.9604644775390625e-08f; }

// Uniform sample lo + (hi - lo) * u in f32, two roundings (no fused multiply-add on either side,
// so host and device agree bit for bit). The result can round up to hi when u is near 1.
LOOM_HD float philox_uniform(uint32_t u, float lo, float hi) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(lo, __fmul_rn(__fsub_rn(hi, lo), philox_unit_float(u)));
#else
  return lo + (hi - lo) * philox_unit_float(u);
#endif
}

// Box-Muller on the lane pairs (0, 1) and (2, 3) of one block, in f64:
//   u1 = ((x_even >> 8) + 1) * 2^-24 in (0, 1],  u2 = (x_odd >> 8) * 2^-24 in [0, 1)
//   r = sqrt(-2 ln u1),  theta = 2 pi u2
//   lane even = mean + std * r cos(theta),  lane odd = mean + std * r sin(theta)
// then rounded once to f32. f64 keeps host (glibc) and device (CUDA libdevice) within an ulp of
// the exact value before the f32 rounding, so the f32 results agree except in rare ties.
// `pair` is 0 for lanes (0, 1) and 1 for lanes (2, 3); out receives the two values.
LOOM_HD void philox_normal_pair(const Philox4& x, int pair, float mean, float std, float* out) {
  const uint32_t a = x.v[2 * pair], b = x.v[2 * pair + 1];
  const double u1 = (static_cast<double>(a >> 8) + 1.0) * 5.9604644775390625e-08;
  const double u2 = static_cast<double>(b >> 8) * 5.9604644775390625e-08;
  const double r = sqrt(-2.0 * log(u1));
  const double theta = 6.283185307179586 * u2;
  const double z0 = r * cos(theta), z1 = r * sin(theta);
#if defined(__CUDA_ARCH__)
  out[0] = static_cast<float>(__dadd_rn(static_cast<double>(mean), __dmul_rn(static_cast<double>(std), z0)));
  out[1] = static_cast<float>(__dadd_rn(static_cast<double>(mean), __dmul_rn(static_cast<double>(std), z1)));
#else
  out[0] = static_cast<float>(static_cast<double>(mean) + static_cast<double>(std) * z0);
  out[1] = static_cast<float>(static_cast<double>(mean) + static_cast<double>(std) * z1);
#endif
}

}  // namespace loom

// Fills: element i of out gets lane i % 4 of philox_block(seed, offset + i / 4), mapped by
// philox_uniform (uniform_fill: values in [lo, hi)) or philox_normal_pair (normal_fill), then
// rounded once to T. T is float, double (CPU only) or bf16; CUDA gives the same bits as the CPU
// for uniform_fill, and for normal_fill the same bits except in rare rounding ties.
namespace loom::cpu {
template <class T> void uniform_fill(T* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi);
template <class T> void normal_fill(T* out, int64_t n, uint64_t seed, uint64_t offset, float mean, float std);
}  // namespace loom::cpu

namespace loom::cuda {
template <class T> void uniform_fill(T* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi, Stream s);
template <class T> void normal_fill(T* out, int64_t n, uint64_t seed, uint64_t offset, float mean, float std, Stream s);
}  // namespace loom::cuda
