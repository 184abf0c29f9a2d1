// DType: every element type Loom stores, described by one traits table (name, block size in
// elements, bytes per block, float-ness, quantized-ness). Packed nf4 holds 2 elements per byte.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace loom {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, u8, boolean, nf4 };
inline constexpr int kNumDTypes = 9;

struct DTypeTraits {
  DType dtype;
  std::string_view name;         // Loom's name: "f32", "bf16", ...
  std::string_view safetensors;  // the safetensors header name: "F32", "BF16", ...
  int block_elems;               // elements per storage block (2 for nf4, else 1)
  int block_bytes;               // bytes per storage block
  bool is_float;
  bool is_quantized;
};

inline constexpr DTypeTraits kDTypeTraits[kNumDTypes] = {
    {DType::f32, "f32", "F32", 1, 4, true, false},
    {DType::f64, "f64", "F64", 1, 8, true, false},
    {DType::bf16, "bf16", "BF16", 1, 2, true, false},
    {DType::f16, "f16", "F16", 1, 2, true, false},
    {DType::i32, "i32", "I32", 1, 4, false, false},
    {DType::i64, "i64", "I64", 1, 8, false, false},
    {DType::u8, "u8", "U8", 1, 1, false, false},
    {DType::boolean, "bool", "BOOL", 1, 1, false, false},
    {DType::nf4, "nf4", "", 2, 1, false, true},
};

constexpr const DTypeTraits& traits(DType t) { return kDTypeTraits[static_cast<int>(t)]; }
constexpr std::string_view name(DType t) { return traits(t).name; }
constexpr bool is_float(DType t) { return traits(t).is_float; }

// Bytes needed for numel elements; numel must be a multiple of the block size.
constexpr int64_t bytes_for(DType t, int64_t numel) {
  const auto& tr = traits(t);
  return (numel + tr.block_elems - 1) / tr.block_elems * tr.block_bytes;
}

// Parses a safetensors dtype string ("BF16"); nullopt when Loom does not know it.
constexpr std::optional<DType> dtype_from_safetensors(std::string_view s) {
  for (const auto& tr : kDTypeTraits)
    if (!tr.safetensors.empty() && tr.safetensors == s) return tr.dtype;
  return std::nullopt;
}
constexpr std::optional<DType> dtype_from_name(std::string_view s) {
  for (const auto& tr : kDTypeTraits)
    if (tr.name == s) return tr.dtype;
  return std::nullopt;
}

static_assert(traits(DType::nf4).block_elems == 2 && traits(DType::bf16).block_bytes == 2);

}  // namespace loom
