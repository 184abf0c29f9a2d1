#include "models/dequant_scratch.h"

namespace loom {
namespace {

// A buffer to keep: in the long-lived pool (engine/memory.h), not among the activations.
std::shared_ptr<Storage> kept_buffer(int64_t bytes, Device device) {
  const LongLivedPoolScope scope;
  return Tensor::empty({bytes}, DType::u8, device).storage();
}

}  // namespace

Tensor DequantScratch::take(const Shape& shape, DType dtype, Device device) {
  std::lock_guard<std::mutex> lock(mu_);
  ++taken_;
  const int64_t need = bytes_for(dtype, numel_of(shape));
  std::shared_ptr<Storage>* small = nullptr;  // a kept buffer nobody holds, too small for this
  bool kept_here = false;
  for (std::shared_ptr<Storage>& s : kept_) {
    if (!(s->device() == device)) continue;
    kept_here = true;
    if (s.use_count() != 1) continue;  // held: whoever had it has not let it go
    if (static_cast<int64_t>(s->nbytes()) >= need) return Tensor::from_storage(s, shape, dtype);
    small = &s;
  }
  if (small) {  // grown: the smaller one goes back to the allocator
    *small = kept_buffer(need, device);
    return Tensor::from_storage(*small, shape, dtype);
  }
  if (kept_here) return Tensor::empty(shape, dtype, device);  // every kept one held: a one-off, not kept
  kept_.push_back(kept_buffer(need, device));
  return Tensor::from_storage(kept_.back(), shape, dtype);
}

int64_t DequantScratch::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t bytes = 0;
  for (const std::shared_ptr<Storage>& s : kept_) bytes += static_cast<int64_t>(s->nbytes());
  return bytes;
}

int64_t DequantScratch::taken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return taken_;
}

}  // namespace loom
