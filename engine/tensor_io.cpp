// Tensor-level safetensors reading and writing (see tensor_io.h).
#include "engine/tensor_io.h"

namespace loom {

absl::Status save_tensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                          std::optional<DType> dtype, const std::map<std::string, std::string>& metadata) {
  std::vector<Tensor> host;  // keeps the bytes alive until written
  std::vector<TensorToWrite> entries;
  host.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    host.push_back(t.to(Device::cpu(), dtype.value_or(t.dtype())).contiguous());
    const Tensor& h = host.back();
    entries.push_back({name, h.dtype(), h.shape(),
                       std::span<const uint8_t>(static_cast<const uint8_t*>(h.data_ptr()), static_cast<size_t>(h.nbytes()))});
  }
  return write_safetensors(path, entries, metadata);
}

Tensor read_tensor(const SafetensorsFile& file, const TensorInfo& info) {
  auto span = file.bytes(info);
  return Tensor::from_storage(borrow(const_cast<uint8_t*>(span.data()), span.size(), Device::cpu(), file.keepalive()),
                              info.shape, info.dtype)
      .clone();
}

absl::StatusOr<std::map<std::string, Tensor>> load_tensors(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  if (!f.ok()) return f.status();
  std::map<std::string, Tensor> out;
  for (const TensorInfo& t : f->tensors()) out[t.name] = read_tensor(*f, t);
  return out;
}

}  // namespace loom
