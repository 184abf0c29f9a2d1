// Tensor: shared storage + shape + strides (in elements) + offset + dtype + device. Views (reshape
// of contiguous data, transpose, narrow, select) share storage; contiguous(), to() and clone() copy.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/memory.h"
#include "kernels/common.h"

namespace loom {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t numel_of(const Shape& s);

class Tensor {
 public:
  Tensor() = default;  // undefined: holds nothing

  // Uninitialized contents.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor empty_pinned(const Shape& shape, DType dtype);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor full(const Shape& shape, float value, DType dtype, Device device = Device::cpu());
  // Copies host values (converted from float/double/int) into a new CPU tensor of dtype.
  static Tensor from_floats(const std::vector<float>& values, const Shape& shape, DType dtype = DType::f32);
  static Tensor from_doubles(const std::vector<double>& values, const Shape& shape, DType dtype = DType::f64);
  static Tensor from_ints(const std::vector<int32_t>& values, const Shape& shape);
  // Wraps existing storage (e.g. a mapped safetensors blob) without copying.
  static Tensor from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype, int64_t offset = 0);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return numel_of(shape_); }
  int64_t offset() const { return offset_; }
  int64_t nbytes() const { return bytes_for(dtype_, numel()); }
  DType dtype() const { return dtype_; }
  Device device() const;
  bool is_cuda() const { return device().is_cuda(); }
  bool is_cpu() const { return device().is_cpu(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // "bf16[2, 3] cuda:0"
  std::string str() const;

  void* data_ptr() const;
  // Typed pointer; throws if T does not match the dtype.
  template <class T>
  T* data() const;

  // Views.
  Tensor view(const Shape& shape) const;     // contiguous only; one -1 allowed
  Tensor reshape(const Shape& shape) const;  // view when contiguous, else a contiguous copy
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;  // drops dim
  Tensor unsqueeze(int64_t dim) const;

  // Copies.
  Tensor contiguous() const;  // this when already contiguous
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype) const;
  Tensor clone() const;
  void copy_(const Tensor& src);  // same shape; any device and float dtype (or same dtype)

  // Host-side readback for tests and tools (synchronizes a CUDA tensor).
  std::vector<float> to_floats() const;
  std::vector<double> to_doubles() const;
  std::vector<int32_t> to_ints() const;
  float item() const;

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::f32;
};

Shape contiguous_strides(const Shape& shape);

// The C++ type behind a dtype, for data<T>() checks.
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }

template <class T>
T* Tensor::data() const {
  LOOM_CHECK(dtype_ == dtype_of<T>(), "Tensor::data<", name(dtype_of<T>()), ">() on a ", str());
  return static_cast<T*>(data_ptr());
}

}  // namespace loom
