// ggml's tensor types as GGUF files store them: one traits table (name, elements and bytes per
// block), the block layouts of the quantised types (static_assert on their sizes, as ggml-common.h),
// CPU dequantisation to f32 and Q8_0 quantisation (kernels/cpu/gguf_quant.cpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

#include "kernels/error.h"

namespace loom {

// ggml_type ids, as written in a GGUF tensor info (gguf-py's GGMLQuantizationType).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35,
  MXFP4 = 39,
};

struct GgmlTypeTraits {
  GgmlType type;
  const char* name;       // "Q4_K", as gguf-py and llama.cpp print it
  int block_elems;        // elements per block (1 for plain types)
  int block_bytes;        // bytes per block
  bool dequantizable;     // dequantize_row supports it
};

// The traits of a type id read from a file; nullopt for an id ggml does not define.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type_id);
const char* ggml_type_name(GgmlType t);

inline constexpr int kQK = 32;    // elements per block of the 32-wide types
inline constexpr int kQK_K = 256; // elements per super-block of the k-quants
inline constexpr int kKScaleBytes = 12;

// Block layouts (ggml-common.h). `d`, `m`, `dmin` are IEEE half bits.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];  // element j in the low nibble of qs[j], element j + 16 in the high one
};
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[kQK / 2];
};
struct BlockQ4_K {
  uint16_t d, dmin;              // super-block scales of the 6-bit sub-block scales and mins
  uint8_t scales[kKScaleBytes];  // 8 scales + 8 mins, 6 bits each
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];  // the fifth bits
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];  // low 4 bits
  uint8_t qh[kQK_K / 4];  // high 2 bits
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ8_0) == 2 + 32, "wrong q8_0 block size/padding");
static_assert(sizeof(BlockQ4_0) == 2 + 16, "wrong q4_0 block size/padding");
static_assert(sizeof(BlockQ4_1) == 4 + 16, "wrong q4_1 block size/padding");
static_assert(sizeof(BlockQ4_K) == 4 + 12 + 128, "wrong q4_K block size/padding");
static_assert(sizeof(BlockQ5_K) == 4 + 12 + 32 + 128, "wrong q5_K block size/padding");
static_assert(sizeof(BlockQ6_K) == 128 + 64 + 16 + 2, "wrong q6_K block size/padding");

// IEEE half <-> f32 (round to nearest even, as numpy's astype(float16) and ggml's reference).
float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);

namespace cpu {

// Dequantises n elements (a multiple of the type's block size) from `src` (n / block_elems blocks)
// to f32. The type must be dequantizable; misuse throws loom::Error.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);
// ggml's quantize_row_q8_0_ref: per block of 32, d = max|x| / 127, q = round(x / d) half away from
// zero. n must be a multiple of 32.
void quantize_row_q8_0(const float* src, BlockQ8_0* dst, int64_t n);

}  // namespace cpu
}  // namespace loom
