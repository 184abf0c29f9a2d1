// GGUF (llama.cpp's model file, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), read
// lazily: the header, metadata and tensor infos are parsed and bounds-checked against the file size,
// tensor bytes are served from a read-only mapping and dequantised to f32 on request.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tensor.h"
#include "kernels/gguf_quant.h"

namespace loom {

enum class GgufType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6, kBool = 7,
  kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};
const char* gguf_type_name(GgufType t);  // "uint32", "array", ...

// One metadata value. Integers keep their exact value (u for unsigned types and bool, i for signed),
// floats widen to double; arrays hold their elements (all of elem_type) in `items`.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  GgufType elem_type = GgufType::kUint8;  // arrays only
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string str;
  std::vector<GgufValue> items;

  bool is_integer() const;
  bool is_float() const { return type == GgufType::kFloat32 || type == GgufType::kFloat64; }
};

struct GgufKv {
  std::string key;
  GgufValue value;
  uint64_t offset;  // file offset of the key, for messages
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the contiguous (fastest) dimension
  uint64_t offset;          // absolute file offset of the data
  uint64_t nbytes;
  int64_t numel;
  uint64_t info_offset;  // file offset of the tensor info, for messages
  // Row-major shape as Loom and PyTorch write it: ne reversed ([rows, cols] for a matrix).
  Shape shape() const;
};

class GgufFile {
 public:
  // Maps `path` and parses it. Errors name the file, what was being read and its offset: NotFound,
  // DataLoss (truncated), InvalidArgument (bad magic, counts the file cannot hold, bad alignment,
  // unknown value or tensor types, duplicate keys or names), Unimplemented (v1, big-endian).
  static absl::StatusOr<GgufFile> open(const std::string& path);
  // The same over bytes in memory; `label` stands for the file name in messages.
  static absl::StatusOr<GgufFile> from_bytes(std::shared_ptr<const std::vector<uint8_t>> bytes, std::string label);

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::string& path() const { return path_; }

  const std::vector<GgufKv>& metadata() const { return kvs_; }  // file order
  const GgufKv* find(std::string_view key) const;               // nullptr when absent
  bool has(std::string_view key) const { return find(key) != nullptr; }
  // Typed access: NotFound when absent, InvalidArgument naming key, offset and type when it does not
  // fit (get_int takes any integer type whose value fits int64; get_float any number).
  absl::StatusOr<int64_t> get_int(std::string_view key) const;
  absl::StatusOr<double> get_float(std::string_view key) const;
  absl::StatusOr<bool> get_bool(std::string_view key) const;
  absl::StatusOr<std::string> get_string(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> get_strings(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> get_ints(std::string_view key) const;
  absl::StatusOr<std::vector<double>> get_floats(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }  // file order
  const GgufTensorInfo* find_tensor(std::string_view name) const;         // nullptr when absent
  std::span<const uint8_t> bytes(const GgufTensorInfo& info) const;
  // The tensor dequantised to an owned f32 CPU tensor of shape info.shape(); Unimplemented for a
  // type Loom cannot dequantise (naming the tensor and type).
  absl::StatusOr<Tensor> read_f32(const GgufTensorInfo& info) const;
  std::shared_ptr<const void> keepalive() const { return keepalive_; }

 private:
  friend class GgufParser;
  std::shared_ptr<const void> keepalive_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr int kGgufMaxDims = 4;           // GGML_MAX_DIMS
inline constexpr int kGgufMaxArrayNesting = 8;  // deeper arrays of arrays are refused
// Array elements over all metadata. Each decodes to a GgufValue of ~90 bytes, so a file of one-byte
// elements would cost ~90x its size without this cap (~0.8 GB at the cap); the largest real
// tokenizers (262k tokens, scores, types, ~500k merges) hold under 1.5M.
inline constexpr uint64_t kGgufMaxMetadataItems = 1ull << 23;

}  // namespace loom
