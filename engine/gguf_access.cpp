// GgufFile lookups: typed metadata getters whose errors name the key, its offset and its type, and
// tensor bytes / f32 dequantisation through kernels/gguf_quant.h.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/gguf.h"

namespace loom {
namespace {

std::string describe(const GgufKv& kv) {
  std::string t(gguf_type_name(kv.value.type));
  if (kv.value.type == GgufType::kArray) t = absl::StrCat("array of ", gguf_type_name(kv.value.elem_type));
  return t;
}

absl::Status wrong(const std::string& path, const GgufKv& kv, const char* expected) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": metadata '", kv.key, "' at offset ", kv.offset, " is ",
                                                 describe(kv), ", expected ", expected));
}

bool int_of(const GgufValue& v, int64_t* out) {
  if (!v.is_integer()) return false;
  const bool is_unsigned = v.type == GgufType::kUint8 || v.type == GgufType::kUint16 ||
                           v.type == GgufType::kUint32 || v.type == GgufType::kUint64;
  if (is_unsigned && v.u > static_cast<uint64_t>(INT64_MAX)) return false;
  *out = is_unsigned ? static_cast<int64_t>(v.u) : v.i;
  return true;
}

bool float_of(const GgufValue& v, double* out) {
  if (v.is_float()) {
    *out = v.f;
    return true;
  }
  int64_t i;
  if (!int_of(v, &i)) return false;
  *out = static_cast<double>(i);
  return true;
}

}  // namespace

const GgufKv* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second];
}

#define LOOM_GGUF_FIND_(key)                                                                          \
  const GgufKv* kv = find(key);                                                                       \
  if (!kv) return absl::NotFoundError(absl::StrCat(path_, ": no metadata key '", std::string(key), "'"));

absl::StatusOr<int64_t> GgufFile::get_int(std::string_view key) const {
  LOOM_GGUF_FIND_(key);
  int64_t v;
  if (!int_of(kv->value, &v)) return wrong(path_, *kv, "an integer that fits int64");
  return v;
}

absl::StatusOr<double> GgufFile::get_float(std::string_view key) const {
  LOOM_GGUF_FIND_(key);
  double v;
  if (!float_of(kv->value, &v)) return wrong(path_, *kv, "a number");
  return v;
}

absl::StatusOr<bool> GgufFile::get_bool(std::string_view key) const {
  LOOM_GGUF_FIND_(key);
  if (kv->value.type != GgufType::kBool) return wrong(path_, *kv, "a bool");
  return kv->value.u != 0;
}

absl::StatusOr<std::string> GgufFile::get_string(std::string_view key) const {
  LOOM_GGUF_FIND_(key);
  if (kv->value.type != GgufType::kString) return wrong(path_, *kv, "a string");
  return kv->value.str;
}

absl::StatusOr<std::vector<std::string>> GgufFile::get_strings(std::string_view key) const {
  LOOM_GGUF_FIND_(key);
  if (kv->value.type != GgufType::kArray || kv->value.elem_type != GgufType::kString)
    return wrong(path_, *kv, "an array of strings");
  std::vector<std::string> out;
  out.reserve(kv->value.items.size());
  for (const GgufValue& v : kv->value.items) out.push_back(v.str);
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::get_ints(std::string_view key) const {
  LOOM_GGUF_FIND_(key);
  std::vector<int64_t> out;
  if (kv->value.type != GgufType::kArray) return wrong(path_, *kv, "an array of integers");
  out.reserve(kv->value.items.size());
  for (const GgufValue& v : kv->value.items) {
    int64_t i;
    if (!int_of(v, &i)) return wrong(path_, *kv, "an array of integers that fit int64");
    out.push_back(i);
  }
  return out;
}

absl::StatusOr<std::vector<double>> GgufFile::get_floats(std::string_view key) const {
  LOOM_GGUF_FIND_(key);
  std::vector<double> out;
  if (kv->value.type != GgufType::kArray) return wrong(path_, *kv, "an array of numbers");
  out.reserve(kv->value.items.size());
  for (const GgufValue& v : kv->value.items) {
    double f;
    if (!float_of(v, &f)) return wrong(path_, *kv, "an array of numbers");
    out.push_back(f);
  }
  return out;
}
#undef LOOM_GGUF_FIND_

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> GgufFile::bytes(const GgufTensorInfo& info) const {
  return {data_ + info.offset, static_cast<size_t>(info.nbytes)};
}

absl::StatusOr<Tensor> GgufFile::read_f32(const GgufTensorInfo& info) const {
  const auto tr = ggml_type_traits(static_cast<uint32_t>(info.type));
  if (!tr || !tr->dequantizable)
    return absl::UnimplementedError(absl::StrCat(
        path_, ": tensor '", info.name, "' is ", ggml_type_name(info.type),
        ", which Loom cannot dequantise (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)"));
  Tensor out = Tensor::empty(info.shape(), DType::f32);
  std::span<const uint8_t> src = bytes(info);
  // Block fields are 2-byte halves; a file with general.alignment 1 can place a tensor at an odd
  // address, so such a tensor is copied to an aligned buffer first (rows keep an even byte count).
  std::vector<uint16_t> aligned;
  if (reinterpret_cast<uintptr_t>(src.data()) % alignof(uint16_t) != 0) {
    aligned.resize((src.size() + 1) / 2);
    std::memcpy(aligned.data(), src.data(), src.size());
    src = {reinterpret_cast<const uint8_t*>(aligned.data()), src.size()};
  }
  // Rows of ne[0] elements: dequantise row by row in parallel (blocks never straddle rows).
  const int64_t row = info.ne[0], rows = row == 0 ? 0 : info.numel / row;
  const int64_t row_bytes = row / tr->block_elems * tr->block_bytes;
  float* dst = out.data<float>();
#pragma omp parallel for schedule(static) if (info.numel > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) cpu::dequantize_row(info.type, src.data() + r * row_bytes, dst + r * row, row);
  return out;
}

}  // namespace loom
