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
  bool ready = false;
  return take(shape, dtype, device, Contents{}, &ready);
}

Tensor DequantScratch::take(const Shape& shape, DType dtype, Device device, const Contents& contents, bool* ready) {
  std::lock_guard<std::mutex> lock(mu_);
  *ready = false;
  const int64_t need = bytes_for(dtype, numel_of(shape));
  Kept* small = nullptr;  // a kept buffer nobody holds, too small for this
  bool kept_here = false;
  for (Kept& k : kept_) {
    if (!(k.storage->device() == device)) continue;
    kept_here = true;
    if (k.storage.use_count() != 1) continue;  // held: whoever had it has not let it go
    if (static_cast<int64_t>(k.storage->nbytes()) < need) {
      small = &k;
      continue;
    }
    *ready = contents.source != nullptr && k.contents == contents && k.shape == shape && k.dtype == dtype;
    if (!*ready) {  // to be written: unknown until filled()
      ++taken_;
      k.contents = Contents{};
    }
    return Tensor::from_storage(k.storage, shape, dtype);
  }
  ++taken_;
  if (small) {  // grown: the smaller one goes back to the allocator
    *small = Kept{kept_buffer(need, device), Contents{}, shape, dtype};
    return Tensor::from_storage(small->storage, shape, dtype);
  }
  if (kept_here) return Tensor::empty(shape, dtype, device);  // every kept one held: a one-off, not kept
  kept_.push_back(Kept{kept_buffer(need, device), Contents{}, shape, dtype});
  return Tensor::from_storage(kept_.back().storage, shape, dtype);
}

void DequantScratch::filled(const Tensor& t, const Contents& contents) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Kept& k : kept_)
    if (k.storage == t.storage()) k.contents = contents, k.shape = t.shape(), k.dtype = t.dtype();
}

int64_t DequantScratch::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t bytes = 0;
  for (const Kept& k : kept_) bytes += static_cast<int64_t>(k.storage->nbytes());
  return bytes;
}

int64_t DequantScratch::taken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return taken_;
}

}  // namespace loom
