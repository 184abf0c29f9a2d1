// See layer_streamer.h.
#include "models/layer_streamer.h"

#include <algorithm>

#include "kernels/error.h"

namespace loom {
namespace {

constexpr int64_t kAlign = 256;  // every piece starts on a 256-byte boundary (vector loads, TMA)

void frozen_variable(ag::Variable& v, const std::function<void(Tensor&)>& fn) {
  if (!v.defined()) return;
  LOOM_CHECK(!v.requires_grad(), "a streamed layer's weight requires grad: layers streamed from host memory ",
             "must be frozen (LoRA or QLoRA, not --full)");
  Tensor t = v.value();
  fn(t);
  v.set_value(std::move(t));
}

void frozen_nf4(std::shared_ptr<const Nf4Weight>& w, const std::function<void(Tensor&)>& fn) {
  if (!w) return;
  Nf4Weight copy = *w;
  for (Tensor* t : {&copy.packed, &copy.absmax, &copy.nested_absmax, &copy.nested_code})
    if (t->defined()) fn(*t);
  w = std::make_shared<const Nf4Weight>(std::move(copy));
}

void frozen_linear(Linear& l, const std::function<void(Tensor&)>& fn) {
  if (!present(l)) return;
  frozen_variable(l.weight, fn);
  frozen_nf4(l.nf4, fn);
  frozen_variable(l.bias, fn);
}

void frozen_norm(RmsNorm& n, const std::function<void(Tensor&)>& fn) { frozen_variable(n.weight, fn); }

}  // namespace

void for_each_frozen_tensor(DecoderLayer& L, const std::function<void(Tensor&)>& fn) {
  frozen_norm(L.input_layernorm, fn);
  frozen_norm(L.post_attention_layernorm, fn);
  if (L.pre_feedforward_layernorm) frozen_norm(*L.pre_feedforward_layernorm, fn);
  if (L.post_feedforward_layernorm) frozen_norm(*L.post_feedforward_layernorm, fn);
  for (Linear* l : L.self_attn.linears()) frozen_linear(*l, fn);
  if (L.self_attn.q_norm) frozen_norm(*L.self_attn.q_norm, fn);
  if (L.self_attn.k_norm) frozen_norm(*L.self_attn.k_norm, fn);
  for (Linear* l : L.mlp.linears()) frozen_linear(*l, fn);
  if (L.moe) {
    frozen_variable(L.moe->router, fn);
    for (ExpertLinear* e : L.moe->experts()) {
      frozen_variable(e->weight, fn);
      for (auto& w : e->nf4) frozen_nf4(w, fn);
    }
  }
}

namespace {
// A weight whose rows lie further apart than its columns (spare columns after them: Linear::widen,
// for the one-GEMM LoRA product) as the contiguous [rows, pitch] it is a view of, or undefined.
Tensor wide_form(const Tensor& t) {
  if (t.dim() != 2 || t.size(0) < 2 || t.strides()[1] != 1 || t.strides()[0] <= t.size(1)) return Tensor();
  return ops::widen_rows(t, t.strides()[0] - t.size(1));
}
// The piece's tensor over `storage` at byte `base`: the stored tensor, or its first cols columns.
Tensor piece_view(const std::shared_ptr<Storage>& storage, int64_t base, const LayerStreamer::Piece& p) {
  const Tensor whole = Tensor::from_storage(storage, p.shape, p.dtype, (base + p.offset) / bytes_for(p.dtype, 1));
  return p.cols > 0 ? whole.narrow(1, 0, p.cols) : whole;
}
}  // namespace

void LayerStreamer::adopt(int64_t index, DecoderLayer& layer) {
  LOOM_CHECK(!entries_.count(index), "LayerStreamer: layer ", index, " is adopted twice");
  Entry e;
  e.layer = &layer;
  // A weight with spare columns is streamed with them, so that a streamed layer computes what the
  // resident one does (the one-GEMM LoRA product needs the room: ag::LoraArgs::w_spare).
  for_each_frozen_tensor(layer, [&](Tensor& t) {
    const Tensor wide = wide_form(t);
    const Tensor& stored = wide.defined() ? wide : t;
    e.pieces.push_back({stored.shape(), stored.dtype(), e.bytes, wide.defined() ? t.size(1) : 0});
    e.bytes += (stored.nbytes() + kAlign - 1) / kAlign * kAlign;
  });
  e.host = compute_.is_cuda() ? Tensor::empty_pinned({e.bytes}, DType::u8) : Tensor::empty({e.bytes}, DType::u8);
  size_t k = 0;
  for_each_frozen_tensor(layer, [&](Tensor& t) {
    const Piece& p = e.pieces[k++];
    Tensor stored = Tensor::from_storage(e.host.storage(), p.shape, p.dtype, p.offset / bytes_for(p.dtype, 1));
    stored.copy_(p.cols > 0 ? wide_form(t) : t);
    t = piece_view(e.host.storage(), 0, p);
  });
  entries_.emplace(index, std::move(e));
}

void LayerStreamer::point(Entry& e, const Tensor& storage) {
  size_t k = 0;
  for_each_frozen_tensor(*e.layer, [&](Tensor& t) { t = piece_view(storage.storage(), storage.offset(), e.pieces[k++]); });
}

int LayerStreamer::slot_of(int64_t index) const {
  for (int s = 0; s < 2; ++s)
    if (slots_[s].resident == index) return s;
  return -1;
}

void LayerStreamer::fill(int s, int64_t index) {
  Slot& slot = slots_[s];
  if (!slot.buffer.defined()) slot.buffer = Tensor::empty({slot_bytes()}, DType::u8, compute_);
  if (slot.resident >= 0) {  // its layer goes back to its host copy (nothing is copied back)
    Entry& old = entries_.at(slot.resident);
    point(old, old.host);
  }
  Entry& e = entries_.at(index);
  Tensor dst = slot.buffer.narrow(0, 0, e.bytes);
  // After the work queued so far on the compute stream: whatever last read this slot.
  slot.ready = copy_to_device_async(e.host, dst);
  slot.resident = index;
  ++copies_;
}

void LayerStreamer::acquire(int64_t index, int direction) {
  auto it = entries_.find(index);
  LOOM_CHECK(it != entries_.end(), "LayerStreamer: layer ", index, " is not streamed");
  int s = slot_of(index);
  if (s < 0) {  // not prefetched: into the slot the layer used last is not in
    s = slot_of(last_) == 0 ? 1 : 0;
    fill(s, index);
  }
  slots_[s].ready.order_compute();
  point(it->second, slots_[s].buffer);
  last_ = index;
  // The next streamed layer of the walk, into the other slot.
  auto next = direction > 0 ? std::next(it) : (it == entries_.begin() ? entries_.end() : std::prev(it));
  if (next != entries_.end() && slot_of(next->first) < 0) fill(1 - s, next->first);
}

int64_t LayerStreamer::host_bytes() const {
  int64_t b = 0;
  for (const auto& [i, e] : entries_) b += e.bytes;
  return b;
}

int64_t LayerStreamer::slot_bytes() const {
  int64_t b = 0;
  for (const auto& [i, e] : entries_) b = std::max(b, e.bytes);
  return b;
}

}  // namespace loom
