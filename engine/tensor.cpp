// Tensor construction, views and copies (see tensor.h).
#include "engine/tensor.h"

#include <cstring>
#include <sstream>

#include "engine/cuda_context.h"
#include "kernels/elementwise.h"
#if LOOM_WITH_CUDA
#include "kernels/cuda_check.h"
#endif

namespace loom {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return st;
}

namespace {

void check_shape(const Shape& shape) {
  for (int64_t d : shape) LOOM_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      uint32_t m = mant;
      do { ++e; m <<= 1; } while ((m & 0x400u) == 0);
      u = sign | (uint32_t(127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

StridedLayout layout_of(const Tensor& t) {
  LOOM_CHECK(t.dim() <= kMaxDims, "tensor has ", t.dim(), " dims; at most ", kMaxDims, " supported: ", t.str());
  StridedLayout l;
  l.ndim = static_cast<int>(t.dim());
  for (int i = 0; i < l.ndim; ++i) {
    l.shape[i] = t.shape()[i];
    l.strides[i] = t.strides()[i];
  }
  return l;
}

[[maybe_unused]] Stream stream_of(Device d) { return d.is_cuda() ? CudaContext::get(d.index).stream : nullptr; }

// dst (contiguous, same device and shape) = cast(src).
void copy_same_device(const Tensor& src, Tensor& dst) {
  const StridedLayout l = layout_of(src);
  const bool cuda = src.is_cuda();
  if (src.dtype() == dst.dtype()) {
    const int es = traits(src.dtype()).block_bytes;
    LOOM_CHECK(traits(src.dtype()).block_elems == 1 || src.is_contiguous(), "strided copy of packed ", src.str());
    if (src.is_contiguous()) {
      if (cuda) {
#if LOOM_WITH_CUDA
        LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToDevice,
                                        stream_of(src.device())));
#endif
      } else {
        memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
      }
      return;
    }
    if (cuda) {
#if LOOM_WITH_CUDA
      cuda::copy_strided_bytes(src.data_ptr(), l, dst.data_ptr(), es, stream_of(src.device()));
#endif
    } else {
      cpu::copy_strided_bytes(src.data_ptr(), l, dst.data_ptr(), es);
    }
    return;
  }
  if (src.dtype() == DType::f16 && src.is_cpu()) {  // checkpoints in F16: converted on the host
    Tensor c = src.contiguous();
    const auto* h = static_cast<const uint16_t*>(c.data_ptr());
    Tensor f = Tensor::empty(src.shape(), DType::f32);
    float* fp = f.data<float>();
    for (int64_t i = 0; i < f.numel(); ++i) fp[i] = half_to_float(h[i]);
    copy_same_device(f, dst);
    return;
  }
  auto cast = [&](auto s_tag, auto d_tag) {
    using S = decltype(s_tag);
    using D = decltype(d_tag);
    if (cuda) {
#if LOOM_WITH_CUDA
      if constexpr (std::is_same_v<S, double> || std::is_same_v<D, double>) {
        LOOM_CHECK(false, "f64 tensors are CPU-only: cannot cast ", src.str(), " to ", name(dst.dtype()));
      } else {
        cuda::copy_strided(static_cast<const S*>(src.data_ptr()), l, static_cast<D*>(dst.data_ptr()),
                           stream_of(src.device()));
      }
#endif
    } else {
      cpu::copy_strided(static_cast<const S*>(src.data_ptr()), l, static_cast<D*>(dst.data_ptr()));
    }
  };
  auto with_dst = [&](auto s_tag) {
    switch (dst.dtype()) {
      case DType::f32: return cast(s_tag, float{});
      case DType::f64: return cast(s_tag, double{});
      case DType::bf16: return cast(s_tag, bf16{});
      default: LOOM_CHECK(false, "cannot cast ", src.str(), " to ", name(dst.dtype()));
    }
  };
  switch (src.dtype()) {
    case DType::f32: return with_dst(float{});
    case DType::f64: return with_dst(double{});
    case DType::bf16: return with_dst(bf16{});
    default: LOOM_CHECK(false, "cannot cast ", src.str(), " to ", name(dst.dtype()));
  }
}

// Contiguous bytes between devices.
void transfer(const Tensor& src, Tensor& dst) {
  LOOM_CHECK(src.is_contiguous() && dst.is_contiguous() && src.dtype() == dst.dtype(), "transfer needs same-dtype contiguous tensors");
  if (src.is_cpu() && dst.is_cpu()) {
    memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
    return;
  }
#if LOOM_WITH_CUDA
  if (src.is_cuda() && dst.is_cuda()) {
    // Between two GPUs (a --device-map run's activations): the copy runs on the destination's stream
    // after the work queued on the source's (an event, not a host wait), and the source's stream
    // waits for the copy in turn, so that its pool does not hand src's bytes out before they are read.
    const cudaStream_t from = static_cast<cudaStream_t>(stream_of(src.device()));
    const cudaStream_t to = static_cast<cudaStream_t>(stream_of(dst.device()));
    cudaEvent_t produced, copied;
    {
      CudaDeviceGuard g(src.device().index);
      LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&produced, cudaEventDisableTiming));
      LOOM_CUDA_CHECK(cudaEventRecord(produced, from));
    }
    CudaDeviceGuard g(dst.device().index);
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(to, produced, 0));
    LOOM_CUDA_CHECK(cudaMemcpyPeerAsync(dst.data_ptr(), dst.device().index, src.data_ptr(), src.device().index,
                                        src.nbytes(), to));
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
    LOOM_CUDA_CHECK(cudaEventRecord(copied, to));
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(from, copied, 0));
    // Destroying a recorded event is allowed: its resources go once it completes.
    LOOM_CUDA_CHECK(cudaEventDestroy(produced));
    LOOM_CUDA_CHECK(cudaEventDestroy(copied));
    return;
  }
  if (dst.is_cuda()) {  // host to device: ordered on the destination's stream
    CudaDeviceGuard g(dst.device().index);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyHostToDevice,
                                    stream_of(dst.device())));
    // Pageable source memory may be reused by the caller as soon as we return.
    if (!src.storage()->pinned()) LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_of(dst.device())));
    return;
  }
  CudaDeviceGuard g(src.device().index);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToHost,
                                  stream_of(src.device())));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_of(src.device())));
#else
  LOOM_CHECK(false, "Loom was built without CUDA (LOOM_CUDA=OFF)");
#endif
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_shape(shape);
  Tensor t;
  t.storage_ = allocate(device, static_cast<size_t>(bytes_for(dtype, numel_of(shape))));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  check_shape(shape);
  Tensor t;
  t.storage_ = allocate_pinned(static_cast<size_t>(bytes_for(dtype, numel_of(shape))));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cpu()) {
    memset(t.data_ptr(), 0, t.nbytes());
  } else {
#if LOOM_WITH_CUDA
    LOOM_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, t.nbytes(), stream_of(device)));
#endif
  }
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, DType dtype, Device device) {
#if LOOM_WITH_CUDA
  // Filled on the device's stream: a copy up from pageable memory would wait for everything queued
  // before it (tensor.cpp's transfer), as the backward's seed gradient did once per step, holding
  // the host back from queueing the backward while the forward ran (session 48's trace: 0.33 ms of
  // idle device a step).
  if (device.is_cuda() && (dtype == DType::f32 || dtype == DType::bf16)) {
    Tensor t = empty(shape, dtype, device);
    if (t.numel() > 0) {
      CudaDeviceGuard g(device.index);
      if (dtype == DType::f32) cuda::fill(t.data<float>(), t.numel(), value, stream_of(device));
      else cuda::fill(t.data<bf16>(), t.numel(), value, stream_of(device));
    }
    return t;
  }
#endif
  Tensor host = from_floats(std::vector<float>(numel_of(shape), value), shape, dtype);
  return device.is_cpu() ? host : host.to(device);
}

Tensor Tensor::from_floats(const std::vector<float>& values, const Shape& shape, DType dtype) {
  LOOM_CHECK(static_cast<int64_t>(values.size()) == numel_of(shape), "from_floats: ", values.size(),
             " values for shape ", shape_str(shape));
  Tensor f = empty(shape, DType::f32);
  memcpy(f.data_ptr(), values.data(), values.size() * sizeof(float));
  return dtype == DType::f32 ? f : f.to(dtype);
}

Tensor Tensor::from_doubles(const std::vector<double>& values, const Shape& shape, DType dtype) {
  LOOM_CHECK(static_cast<int64_t>(values.size()) == numel_of(shape), "from_doubles: ", values.size(),
             " values for shape ", shape_str(shape));
  Tensor f = empty(shape, DType::f64);
  memcpy(f.data_ptr(), values.data(), values.size() * sizeof(double));
  return dtype == DType::f64 ? f : f.to(dtype);
}

Tensor Tensor::from_ints(const std::vector<int32_t>& values, const Shape& shape) {
  LOOM_CHECK(static_cast<int64_t>(values.size()) == numel_of(shape), "from_ints: ", values.size(),
             " values for shape ", shape_str(shape));
  Tensor t = empty(shape, DType::i32);
  memcpy(t.data_ptr(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype, int64_t offset) {
  check_shape(shape);
  LOOM_CHECK(offset >= 0 && static_cast<size_t>(bytes_for(dtype, offset + numel_of(shape))) <= storage->nbytes(),
             "from_storage: shape ", shape_str(shape), " of ", name(dtype), " at offset ", offset,
             " exceeds storage of ", storage->nbytes(), " bytes");
  Tensor t;
  t.storage_ = std::move(storage);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.offset_ = offset;
  t.dtype_ = dtype;
  return t;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t n = dim();
  if (d < 0) d += n;
  LOOM_CHECK(d >= 0 && d < n, "size(", d, ") of ", str());
  return shape_[d];
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  return std::string(name(dtype_)) + shape_str(shape_) + " " + device().str();
}

void* Tensor::data_ptr() const {
  LOOM_CHECK(defined(), "data_ptr() of an undefined tensor");
  // A storage without memory (an autograd output nothing reads) is null in every view of it.
  char* base = static_cast<char*>(storage_->data());
  return base ? base + bytes_for(dtype_, offset_) : nullptr;
}

Tensor Tensor::view(const Shape& shape) const {
  LOOM_CHECK(is_contiguous(), "view", shape_str(shape), " of non-contiguous ", str(), "; call contiguous() first");
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      LOOM_CHECK(infer < 0, "view: more than one -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    LOOM_CHECK(known > 0 && numel() % known == 0, "view", shape_str(shape), " of ", str());
    s[infer] = numel() / known;
  }
  LOOM_CHECK(numel_of(s) == numel(), "view", shape_str(shape), " of ", str(), ": element counts differ");
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const { return is_contiguous() ? view(shape) : contiguous().view(shape); }

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  if (d0 < 0) d0 += dim();
  if (d1 < 0) d1 += dim();
  LOOM_CHECK(d0 >= 0 && d0 < dim() && d1 >= 0 && d1 < dim(), "transpose(", d0, ", ", d1, ") of ", str());
  LOOM_CHECK(traits(dtype_).block_elems == 1, "transpose of packed ", str());
  Tensor t = *this;
  std::swap(t.shape_[d0], t.shape_[d1]);
  std::swap(t.strides_[d0], t.strides_[d1]);
  return t;
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  if (d < 0) d += dim();
  LOOM_CHECK(d >= 0 && d < dim() && start >= 0 && length >= 0 && start + length <= shape_[d], "narrow(dim=", d,
             ", start=", start, ", length=", length, ") of ", str());
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = length;
  return t;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  if (d < 0) d += dim();
  LOOM_CHECK(d >= 0 && d < dim() && index >= 0 && index < shape_[d], "select(dim=", d, ", index=", index, ") of ", str());
  Tensor t = narrow(d, index, 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::unsqueeze(int64_t d) const {
  if (d < 0) d += dim() + 1;
  LOOM_CHECK(d >= 0 && d <= dim(), "unsqueeze(", d, ") of ", str());
  Tensor t = *this;
  t.shape_.insert(t.shape_.begin() + d, 1);
  t.strides_.insert(t.strides_.begin() + d, d < dim() ? strides_[d] * shape_[d] : 1);
  return t;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = empty(shape_, dtype_, device());
  copy_same_device(*this, out);
  return out;
}

Tensor Tensor::to(Device device) const { return to(device, dtype_); }
Tensor Tensor::to(DType dtype) const { return to(device(), dtype); }

Tensor Tensor::to(Device device, DType dtype) const {
  if (device == this->device() && dtype == dtype_) return *this;
  Tensor out = empty(shape_, dtype, device);
  out.copy_(*this);
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_, device());
  out.copy_(*this);
  return out;
}

void Tensor::copy_(const Tensor& src) {
  LOOM_CHECK(defined() && src.defined(), "copy_ with an undefined tensor");
  LOOM_CHECK(shape_ == src.shape_, "copy_: destination ", str(), " and source ", src.str(), " differ in shape");
  LOOM_CHECK(is_contiguous(), "copy_ into a non-contiguous destination ", str(), " is not supported");
  if (src.device() == device()) {
    copy_same_device(src, *this);
    return;
  }
  // Cast on the source device when that shrinks the transfer, else on the destination.
  const bool cast_first = bytes_for(dtype_, 1) <= bytes_for(src.dtype_, 1) && !(src.is_cuda() && dtype_ == DType::f64);
  Tensor staged = cast_first ? src.to(src.device(), dtype_).contiguous() : src.contiguous();
  if (staged.dtype() == dtype_ && is_contiguous()) {
    transfer(staged, *this);
    return;
  }
  Tensor moved = empty(shape_, staged.dtype(), device());
  transfer(staged, moved);
  copy_same_device(moved, *this);
}

std::vector<float> Tensor::to_floats() const {
  Tensor h = to(Device::cpu(), DType::f32).contiguous();
  const float* p = h.data<float>();
  return std::vector<float>(p, p + h.numel());
}

std::vector<double> Tensor::to_doubles() const {
  Tensor h = to(Device::cpu(), DType::f64).contiguous();
  const double* p = h.data<double>();
  return std::vector<double>(p, p + h.numel());
}

std::vector<int32_t> Tensor::to_ints() const {
  LOOM_CHECK(dtype_ == DType::i32, "to_ints() of ", str());
  Tensor h = to(Device::cpu()).contiguous();
  const int32_t* p = h.data<int32_t>();
  return std::vector<int32_t>(p, p + h.numel());
}

float Tensor::item() const {
  LOOM_CHECK(numel() == 1, "item() of ", str(), ": needs exactly one element");
  return to_floats()[0];
}

}  // namespace loom
