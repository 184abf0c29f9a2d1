// Safetensors I/O (https://huggingface.co/docs/safetensors): a lazy reader that parses and validates
// only the JSON header and serves tensor bytes from a read-only mapping, and an atomic writer.
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
#include "engine/dtype.h"

namespace loom {

// Headers larger than this are rejected as corrupt (the reference implementation's limit).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // [] for a 0-d scalar
  uint64_t offset;             // byte offset from the start of the FILE (8 + header + data_offsets[0])
  uint64_t nbytes;             // data_offsets[1] - data_offsets[0] == numel * element size
};

class SafetensorsFile {
 public:
  // Maps `path` and validates its header. Errors name the file and, where one is involved, the
  // tensor: NotFound (no such file), DataLoss (file truncated: shorter than its header or data
  // says), InvalidArgument (malformed or unsupported header contents).
  static absl::StatusOr<SafetensorsFile> open(const std::string& path);
  // The same over bytes held in memory; `label` stands for the file name in error messages.
  static absl::StatusOr<SafetensorsFile> from_bytes(std::shared_ptr<const std::vector<uint8_t>> bytes,
                                                    std::string label);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by offset
  const TensorInfo* find(std::string_view name) const;                 // nullptr when absent
  // A view of the tensor's bytes inside the mapping; `info` must come from this file.
  std::span<const uint8_t> bytes(const TensorInfo& info) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Owns the mapping: hold it for as long as any span from bytes() (or memory aliasing it) is used.
  std::shared_ptr<const void> keepalive() const { return keepalive_; }
  const std::string& path() const { return path_; }

 private:
  static absl::StatusOr<SafetensorsFile> parse(std::shared_ptr<const void> keepalive, const uint8_t* data,
                                               size_t size, std::string label);

  std::shared_ptr<const void> keepalive_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const uint8_t> data;  // exactly numel * element size bytes
};

// Writes a safetensors file: tensors laid out in the given order, header padded with spaces so the
// data starts 8-byte aligned, metadata stored under "__metadata__" (omitted when empty). Writes
// "<path>.tmp.<pid>", fsyncs it and renames it over `path`, so a crash never leaves a half file.
// InvalidArgument on duplicate or reserved names, a shape/size mismatch, or a dtype with no
// safetensors name (nf4); the errno status otherwise.
absl::Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

}  // namespace loom
