// Checkpoint: every tensor of a Hugging Face model folder (model.safetensors, or
// model.safetensors.index.json + its shards) by name, loaded zero-copy from the file mappings and
// moved to a device and dtype in one step.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/safetensors.h"
#include "engine/tensor.h"

namespace loom {

class Checkpoint {
 public:
  // Opens model_dir/model.safetensors.index.json (and every shard its weight_map names) when it
  // exists, else model_dir/model.safetensors. Errors name the folder or file: NotFound (folder
  // missing, no safetensors, a listed shard missing), InvalidArgument (index JSON malformed, a tensor
  // listed in the index but absent from its shard, the same tensor in two shards), and whatever
  // SafetensorsFile::open reports for a corrupt shard. Only headers are read here.
  static absl::StatusOr<Checkpoint> open(const std::string& model_dir);
  // Tensors already in memory (CPU, float), e.g. a dequantised GGUF; `label` stands for the folder
  // in messages. load() hands them out without a copy when no conversion is needed.
  static Checkpoint from_tensors(std::string label, std::map<std::string, Tensor> tensors);

  std::vector<std::string> names() const;                 // sorted
  const TensorInfo* find(const std::string& name) const;  // nullptr when absent
  // The shard file holding `name` ("" when absent).
  std::string file_of(const std::string& name) const;
  const std::string& dir() const { return dir_; }
  size_t num_files() const { return files_.size(); }

  // Reads one tensor onto `device`. Float sources (F32, F64, BF16, F16) are converted to `dtype`,
  // which must be f32 or bf16 (or f64 on the CPU); integer/bool sources (e.g. pre-quantized U8
  // weights) keep their own dtype and `dtype` is ignored. A non-empty expected_shape must match:
  // else InvalidArgument naming the tensor, the file, the expected and actual shapes.
  // CUDA: the bytes go straight from the mapping in one host-to-device copy of the source dtype
  // (F32/BF16 are then cast on the device; F16/F64 are converted on the host first). CPU: the result
  // is a copy that the caller owns (the mapping is read-only, and CPU weights may be updated in place).
  absl::StatusOr<Tensor> load(const std::string& name, DType dtype, Device device,
                              const Shape& expected_shape = {}) const;

  // OkStatus when every tensor name is in `consumed`; else InvalidArgument listing (up to 20 of)
  // the tensors never loaded, to catch a model that misreads a checkpoint.
  absl::Status check_unexpected(const std::set<std::string>& consumed) const;

  // load() refuses a float tensor holding NaN or infinity (InvalidArgument naming the file, the
  // tensor and its first bad element) unless allowed here.
  void set_allow_nonfinite(bool allow) { allow_nonfinite_ = allow; }

 private:
  absl::StatusOr<Tensor> load_owned(const std::string& name, const Tensor& t, DType dtype, Device device,
                                    const Shape& expected_shape) const;
  struct Owned {
    std::map<std::string, Tensor> tensors;
    std::vector<TensorInfo> infos;
  };
  static constexpr size_t kOwnedFile = static_cast<size_t>(-1);
  struct Entry {
    size_t file;             // index into files_, or kOwnedFile for a tensor of owned_
    const TensorInfo* info;  // points into *files_[file] (stable: the files are shared, never moved)
  };

  std::string dir_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, Entry> index_;
  std::shared_ptr<const Owned> owned_;
  bool allow_nonfinite_ = false;
};

}  // namespace loom
