#include "models/dequant_scratch.h"

namespace loom {

Tensor DequantScratch::take(const Shape& shape, DType dtype, Device device) {
  std::lock_guard<std::mutex> lock(mu_);
  ++taken_;
  for (const Tensor& t : kept_) {
    if (t.shape() != shape || t.dtype() != dtype || !(t.device() == device)) continue;
    // Only kept_ holds it: whoever had it last has let it go.
    if (t.storage().use_count() == 1) return t;
    return Tensor::empty(shape, dtype, device);  // still held: a one-off, not kept
  }
  kept_.push_back(Tensor::empty(shape, dtype, device));
  return kept_.back();
}

int64_t DequantScratch::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t bytes = 0;
  for (const Tensor& t : kept_) bytes += static_cast<int64_t>(t.storage()->nbytes());
  return bytes;
}

int64_t DequantScratch::taken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return taken_;
}

}  // namespace loom
