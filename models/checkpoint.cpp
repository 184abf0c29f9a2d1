// Checkpoint: resolves a Hugging Face model folder to its safetensors files (single or sharded with
// an index), checks that the index and the shards agree, and loads tensors straight from the
// mappings onto a device.
#include "models/checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "engine/io_error.h"
#include "engine/model_path.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/status_macros.h"
#include "kernels/error.h"
#include "kernels/finite.h"
#include "models/finite_check.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string dtype_str(DType t) { return std::string(name(t)); }

constexpr const char* kNonfiniteAdvice =
    " (the file is damaged or the model diverged; --allow-nonfinite loads it anyway)";

// The safetensors / PyTorch files in `dir` (for the "nothing to load" message).
std::string weight_files_in(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    const std::string ext = e.path().extension().string();
    if (ext == ".safetensors" || ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".gguf") found.push_back(n);
  }
  std::sort(found.begin(), found.end());
  if (found.empty()) return "no weight files at all";
  if (found.size() > 8) {
    const size_t more = found.size() - 8;
    found.resize(8);
    found.push_back(absl::StrCat("... and ", more, " more"));
  }
  return absl::StrCat("found: ", absl::StrJoin(found, ", "));
}

// model.safetensors.index.json -> weight_map entries (tensor name -> shard file name).
absl::StatusOr<std::map<std::string, std::string>> read_index(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in || is_directory_path(path)) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", open_error_reason(path)));
  std::ostringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object())
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected a JSON object with a \"weight_map\" object {tensor name: shard file}"));
  std::map<std::string, std::string> map;
  for (const auto& [tensor, shard] : j.at("weight_map").items()) {
    if (!shard.is_string() || shard.get<std::string>().empty())
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": weight_map entry '", tensor, "' is ", shard.dump(), ", expected a shard file name"));
    const std::string s = shard.get<std::string>();
    if (s.front() == '/' || s.find("..") != std::string::npos)
      return absl::InvalidArgumentError(absl::StrCat(path, ": weight_map entry '", tensor, "' names '", s,
                                                     "', expected a file inside the model folder"));
    map.emplace(tensor, s);
  }
  if (map.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": weight_map lists no tensors"));
  return map;
}

}  // namespace

absl::StatusOr<Checkpoint> Checkpoint::open(const std::string& model_dir) {
  std::error_code ec;
  LOOM_RETURN_IF_ERROR(check_input_path(model_dir, "model folder", "a Hugging Face model folder"));
  if (!fs::is_directory(model_dir, ec)) {
    const absl::Status s = wrong_kind(model_dir, sniff_path(model_dir), "a Hugging Face model folder");
    return absl::FailedPreconditionError(s.message());
  }

  Checkpoint c;
  c.dir_ = model_dir;
  const std::string index_path = model_dir + "/" + kIndexFile;
  const std::string single_path = model_dir + "/" + kSingleFile;

  if (fs::exists(index_path, ec)) {
    auto weight_map = read_index(index_path);
    if (!weight_map.ok()) return weight_map.status();
    // Open each shard once, in name order; remember one tensor that names it for messages.
    std::map<std::string, std::string> shards;  // shard -> first tensor listed in it
    for (const auto& [tensor, shard] : *weight_map) shards.emplace(shard, tensor);
    std::map<std::string, size_t> shard_index;
    for (const auto& [shard, tensor] : shards) {
      const std::string path = model_dir + "/" + shard;
      if (!fs::exists(path, ec))
        return absl::NotFoundError(absl::StrCat(index_path, ": shard '", shard, "' (listed for tensor '", tensor,
                                                "') is missing: no file ", path));
      auto f = SafetensorsFile::open(path);
      if (!f.ok()) return f.status();
      shard_index[shard] = c.files_.size();
      c.files_.push_back(std::make_shared<const SafetensorsFile>(std::move(*f)));
    }
    for (size_t i = 0; i < c.files_.size(); ++i)
      for (const TensorInfo& t : c.files_[i]->tensors()) {
        auto [it, fresh] = c.index_.emplace(t.name, Entry{i, &t});
        if (!fresh)
          return absl::InvalidArgumentError(absl::StrCat(model_dir, ": tensor '", t.name, "' is in two shards, ",
                                                         c.files_[it->second.file]->path(), " and ",
                                                         c.files_[i]->path()));
      }
    for (const auto& [tensor, shard] : *weight_map) {
      auto it = c.index_.find(tensor);
      if (it == c.index_.end())
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor '", tensor, "' is listed in shard '",
                                                       shard, "' but that file has no such tensor"));
      if (it->second.file != shard_index.at(shard))
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor '", tensor, "' is listed in shard '",
                                                       shard, "' but is stored in ",
                                                       c.files_[it->second.file]->path()));
    }
    return c;
  }

  if (!fs::exists(single_path, ec))
    return absl::NotFoundError(absl::StrCat(model_dir, ": no ", kSingleFile, " or ", kIndexFile,
                                            " (Loom reads safetensors checkpoints only; ", weight_files_in(model_dir),
                                            ")"));
  auto f = SafetensorsFile::open(single_path);
  if (!f.ok()) return f.status();
  c.files_.push_back(std::make_shared<const SafetensorsFile>(std::move(*f)));
  for (const TensorInfo& t : c.files_[0]->tensors()) c.index_.emplace(t.name, Entry{0, &t});
  return c;
}

Checkpoint Checkpoint::from_tensors(std::string label, std::map<std::string, Tensor> tensors) {
  auto owned = std::make_shared<Owned>();
  owned->tensors = std::move(tensors);
  owned->infos.reserve(owned->tensors.size());
  for (const auto& [name, t] : owned->tensors)
    owned->infos.push_back({name, t.dtype(), t.shape(), 0, static_cast<uint64_t>(t.nbytes())});
  Checkpoint c;
  c.dir_ = std::move(label);
  for (const TensorInfo& info : owned->infos) c.index_.emplace(info.name, Entry{kOwnedFile, &info});
  c.owned_ = std::move(owned);
  return c;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [n, e] : index_) out.push_back(n);
  return out;
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second.info;
}

std::string Checkpoint::file_of(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return std::string();
  return it->second.file == kOwnedFile ? dir_ : files_[it->second.file]->path();
}

absl::StatusOr<Tensor> Checkpoint::load(const std::string& name, DType dtype, Device device,
                                        const Shape& expected_shape) const {
  auto it = index_.find(name);
  if (it == index_.end())
    return absl::NotFoundError(
        absl::StrCat(dir_, ": the checkpoint has no tensor '", name, "' (", index_.size(), " tensors)"));
  if (it->second.file == kOwnedFile) return load_owned(name, owned_->tensors.at(name), dtype, device, expected_shape);
  const SafetensorsFile& file = *files_[it->second.file];
  const TensorInfo& info = *it->second.info;
  if (!expected_shape.empty() && info.shape != expected_shape)
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor '", name, "' has shape ",
                                                   shape_str(info.shape), ", expected ", shape_str(expected_shape)));
  DType target = info.dtype;
  if (is_float(info.dtype)) {
    const bool ok = dtype == DType::f32 || dtype == DType::bf16 || (dtype == DType::f64 && device.is_cpu());
    if (!ok)
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor '", name, "' (", dtype_str(info.dtype),
                                                     ") cannot be loaded as ", dtype_str(dtype), " on ", device.str(),
                                                     ": expected f32 or bf16 (f64 on the CPU)"));
    target = dtype;
  }

  // The source: a view of the mapping, zero copy. safetensors only promises byte offsets, so a
  // tensor that is not aligned to its element size (never the case for files written by the
  // reference implementation, which pads the header to 8 bytes) is copied to aligned memory.
  const std::span<const uint8_t> bytes = file.bytes(info);
  void* ptr = const_cast<uint8_t*>(bytes.data());  // only ever read: the mapping is PROT_READ
  std::shared_ptr<Storage> storage;
  if (reinterpret_cast<uintptr_t>(ptr) % traits(info.dtype).block_bytes == 0) {
    storage = borrow(ptr, bytes.size(), Device::cpu(), file.keepalive());
  } else {
    storage = allocate(Device::cpu(), bytes.size());
    std::memcpy(storage->data(), ptr, bytes.size());
  }
  try {
    const Tensor src = Tensor::from_storage(std::move(storage), info.shape, info.dtype);
    const bool check = !allow_nonfinite_ && is_float(info.dtype);
    if (check && device.is_cpu() && src.dtype() == target) {
      // The copy and the check in one pass (each chunk tested while in cache): on the CI machine
      // a 120 MB bf16 model loads in about the time of the copy alone, where a separate scan of the
      // mapping added 17 ms to 27-60 ms.
      Tensor dst = Tensor::empty(info.shape, target);
      const int64_t bad = cpu::copy_first_nonfinite(src.data_ptr(), dst.data_ptr(), src.numel(),
                                                    traits(target).block_bytes, target == DType::f16);
      if (bad >= 0)
        return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor '", name, "' holds ",
                                                       describe_nonfinite(dst, bad), kNonfiniteAdvice));
      return dst;
    }
    // Else checked where the bytes are, before a conversion or upload reads them.
    if (check) LOOM_RETURN_IF_ERROR(check_finite(src, file.path(), name, kNonfiniteAdvice));
    if (device.is_cpu()) return src.dtype() == target ? src.clone() : src.to(Device::cpu(), target);
    // CUDA: Tensor::copy_ would cast F32 -> BF16 on the host (to shrink the transfer); casting on the
    // device is faster than a single host thread, so move the source bytes as they are, then cast.
    if (info.dtype == DType::f16 || info.dtype == DType::f64) return src.to(Device::cpu(), target).to(device);
    Tensor on_device = src.to(device);  // one host-to-device copy straight from the mapping
    return on_device.dtype() == target ? on_device : on_device.to(target);
  } catch (const Error& e) {
    return absl::FailedPreconditionError(absl::StrCat(file.path(), ": tensor '", name, "': cannot load it onto ",
                                                      device.str(), " as ", dtype_str(target), ": ", e.what()));
  }
}

absl::StatusOr<Tensor> Checkpoint::load_owned(const std::string& name, const Tensor& t, DType dtype, Device device,
                                              const Shape& expected_shape) const {
  if (!expected_shape.empty() && t.shape() != expected_shape)
    return absl::InvalidArgumentError(absl::StrCat(dir_, ": tensor '", name, "' has shape ", shape_str(t.shape()),
                                                   ", expected ", shape_str(expected_shape)));
  if (!allow_nonfinite_) LOOM_RETURN_IF_ERROR(check_finite(t, dir_, name, kNonfiniteAdvice));
  try {
    return t.dtype() == dtype && device.is_cpu() ? t : t.to(device, dtype);
  } catch (const Error& e) {
    return absl::FailedPreconditionError(absl::StrCat(dir_, ": tensor '", name, "': cannot load it onto ", device.str(),
                                                      " as ", dtype_str(dtype), ": ", e.what()));
  }
}

absl::Status Checkpoint::check_unexpected(const std::set<std::string>& consumed) const {
  std::vector<std::string> unused;
  for (const auto& [n, e] : index_)
    if (!consumed.count(n)) unused.push_back(n);
  if (unused.empty()) return absl::OkStatus();
  const size_t total = unused.size();
  if (total > 20) {
    unused.resize(20);
    unused.push_back(absl::StrCat("... and ", total - 20, " more"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(dir_, ": ", total, " of the checkpoint's ", index_.size(),
                   " tensors were never loaded (wrong model family or config?): ", absl::StrJoin(unused, ", ")));
}

}  // namespace loom
