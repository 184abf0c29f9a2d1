// MappedFile: a read-only memory mapping of a whole file (RAII, move-only). Safetensors weights are
// read through it so that tensors can alias the page cache instead of being copied.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace loom {

class MappedFile {
 public:
  // Maps `path` read-only. An empty file gives data() == nullptr and size() == 0. Errors name the
  // path: NotFound when it does not exist, FailedPrecondition when it is not a regular file.
  static absl::StatusOr<MappedFile> open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset();

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace loom
