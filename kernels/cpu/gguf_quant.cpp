// CPU dequantisation of ggml's block types to f32 and Q8_0 quantisation, written from the block
// layouts in kernels/gguf_quant.h (the formulas of ggml-quants.c's *_ref functions).
#include "kernels/gguf_quant.h"

#include <cmath>
#include <cstring>

#include "kernels/common.h"
#include "kernels/error.h"

namespace loom {
namespace {

constexpr GgmlTypeTraits kTraits[] = {
    {GgmlType::F32, "F32", 1, 4, true},          {GgmlType::F16, "F16", 1, 2, true},
    {GgmlType::Q4_0, "Q4_0", 32, 18, true},      {GgmlType::Q4_1, "Q4_1", 32, 20, true},
    {GgmlType::Q5_0, "Q5_0", 32, 22, false},     {GgmlType::Q5_1, "Q5_1", 32, 24, false},
    {GgmlType::Q8_0, "Q8_0", 32, 34, true},      {GgmlType::Q8_1, "Q8_1", 32, 40, false},
    {GgmlType::Q2_K, "Q2_K", 256, 84, false},    {GgmlType::Q3_K, "Q3_K", 256, 110, false},
    {GgmlType::Q4_K, "Q4_K", 256, 144, true},    {GgmlType::Q5_K, "Q5_K", 256, 176, true},
    {GgmlType::Q6_K, "Q6_K", 256, 210, true},    {GgmlType::Q8_K, "Q8_K", 256, 292, false},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66, false}, {GgmlType::IQ2_XS, "IQ2_XS", 256, 74, false},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98, false}, {GgmlType::IQ1_S, "IQ1_S", 256, 50, false},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18, false},  {GgmlType::IQ3_S, "IQ3_S", 256, 110, false},
    {GgmlType::IQ2_S, "IQ2_S", 256, 82, false},   {GgmlType::IQ4_XS, "IQ4_XS", 256, 136, false},
    {GgmlType::I8, "I8", 1, 1, false},            {GgmlType::I16, "I16", 1, 2, false},
    {GgmlType::I32, "I32", 1, 4, false},          {GgmlType::I64, "I64", 1, 8, false},
    {GgmlType::F64, "F64", 1, 8, false},          {GgmlType::IQ1_M, "IQ1_M", 256, 56, false},
    {GgmlType::BF16, "BF16", 1, 2, true},         {GgmlType::TQ1_0, "TQ1_0", 256, 54, false},
    {GgmlType::TQ2_0, "TQ2_0", 256, 66, false},   {GgmlType::MXFP4, "MXFP4", 32, 17, false},
};

float f16(uint16_t h) { return fp16_to_f32(h); }

// The j-th 6-bit scale and min of a k-quant super-block (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void dequant_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = f16(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = f16(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = f16(b[i].d), m = f16(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
      y[j + kQK / 2] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void dequant_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16(b[i].d), dmin = f16(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int j = 0, is = 0; j < kQK_K; j += 64, is += 2, q += 32) {
      uint8_t sc, m;
      scale_min_k4(is, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void dequant_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16(b[i].d), dmin = f16(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < kQK_K; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      scale_min_k4(is, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int n = 0; n < kQK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type_id) {
  for (const auto& t : kTraits)
    if (static_cast<uint32_t>(t.type) == type_id) return t;
  return std::nullopt;
}

const char* ggml_type_name(GgmlType t) {
  auto tr = ggml_type_traits(static_cast<uint32_t>(t));
  return tr ? tr->name : "?";
}

float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t f32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00u;           // NaN
  if (abs >= 0x477FF000u) return sign | 0x7C00u;          // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                                // below the smallest normal half (2^-14)
    if (abs < 0x33000000u) return sign;                   // below half the smallest subnormal: 0
    const uint32_t e = abs >> 23;
    const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;                       // 14 + 13 - (e - 127) ... in [14, 24]
    const uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    const uint32_t r = q + (rem > halfway || (rem == halfway && (q & 1u)) ? 1u : 0u);
    return sign | static_cast<uint16_t>(r);
  }
  const uint32_t rebased = abs - (112u << 23);            // exponent bias 127 -> 15
  const uint32_t q = rebased >> 13, rem = rebased & 0x1FFFu;
  const uint32_t r = q + (rem > 0x1000u || (rem == 0x1000u && (q & 1u)) ? 1u : 0u);
  return sign | static_cast<uint16_t>(r);
}

namespace cpu {

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  auto tr = ggml_type_traits(static_cast<uint32_t>(type));
  LOOM_CHECK(tr && tr->dequantizable, "dequantize_row: ggml type ", static_cast<uint32_t>(type), " (",
             ggml_type_name(type), ") has no dequantisation in Loom");
  LOOM_CHECK(n >= 0 && n % tr->block_elems == 0, "dequantize_row: ", n, " elements of ", tr->name,
             " is not a whole number of ", tr->block_elems, "-element blocks");
  const int64_t nb = n / tr->block_elems;
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(h[i]);
      return;
    }
    case GgmlType::BF16: {
      const auto* h = static_cast<const bf16*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(h[i]);
      return;
    }
    case GgmlType::Q8_0: return dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
    case GgmlType::Q4_0: return dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
    case GgmlType::Q4_1: return dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb);
    case GgmlType::Q4_K: return dequant_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb);
    case GgmlType::Q5_K: return dequant_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb);
    case GgmlType::Q6_K: return dequant_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb);
    default: break;
  }
  LOOM_CHECK(false, "dequantize_row: no case for ", tr->name);
}

void quantize_row_q8_0(const float* src, BlockQ8_0* dst, int64_t n) {
  LOOM_CHECK(n >= 0 && n % kQK == 0, "quantize_row_q8_0: ", n, " elements is not a whole number of 32-element blocks");
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    float amax = 0.f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    dst[i].d = f32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) dst[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

}  // namespace cpu
}  // namespace loom
