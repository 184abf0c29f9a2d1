// Writes GGUF v3 files (llama.cpp's model format, the layout engine/gguf.h reads): metadata in the
// order added, tensor infos, then each tensor's data at a multiple of the alignment, encoded from
// f32 to F32, F16, BF16 or Q8_0 one tensor at a time while writing (no second copy of the model).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/gguf.h"
#include "engine/tensor.h"

namespace loom {

// Metadata values for GgufWriter::add (the GgufValue a reader gives back).
GgufValue gguf_u32(uint32_t v);
GgufValue gguf_i32(int32_t v);
GgufValue gguf_f32(float v);
GgufValue gguf_bool(bool v);
GgufValue gguf_string(std::string v);
GgufValue gguf_strings(const std::vector<std::string>& v);
GgufValue gguf_i32s(const std::vector<int32_t>& v);
GgufValue gguf_f32s(const std::vector<float>& v);

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = kGgufDefaultAlignment) : alignment_(alignment) {}

  // A metadata pair; a key added twice is a loom::Error. general.alignment is written by write().
  void add(std::string key, GgufValue value);
  bool has(const std::string& key) const;
  // A tensor from a contiguous f32 CPU tensor (row-major shape; ggml's ne is the shape reversed),
  // encoded as `type` when written: F32, F16 or BF16 (round to nearest even), or Q8_0 (ggml's
  // quantize_row_q8_0_ref; the last dimension must be a multiple of 32). The tensor is kept by
  // reference until write().
  void add_tensor(std::string name, Tensor f32, GgmlType type);

  // Writes the file to a temporary name in the same folder and renames it to `path`; errors name
  // the path and the OS reason.
  absl::Status write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    Tensor data;
    GgmlType type;
    uint64_t nbytes, offset;
  };
  uint32_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> kvs_;
  std::vector<Entry> tensors_;
};

// `src` (n f32 values, n a multiple of the type's block size) encoded as `type` (F32, F16, BF16,
// Q8_0) into dst (n / block_elems * block_bytes bytes).
void gguf_encode_row(GgmlType type, const float* src, int64_t n, uint8_t* dst);

}  // namespace loom
