// Decoder layers whose frozen weights live in host memory (`--device-map` placing them on "cpu" in a
// CUDA run): each such layer's weights sit in one pinned buffer and are copied into one of two
// device slots before the layer runs, the next streamed layer's copy overlapping this one's compute
// (on the device's upload stream, ordered with events). Forward walks the layers up, recompute in
// backward walks them down, so the layer prefetched is the next one in the walk's direction. Frozen
// weights are only ever copied host -> device; LoRA adapters and their state stay on the device.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "engine/transfer.h"
#include "models/layers.h"

namespace loom {

class LayerStreamer {
 public:
  // `compute`: the device the streamed layers run on (a GPU; the CPU in tests, where the "copies"
  // are plain copies between host buffers).
  explicit LayerStreamer(Device compute) : compute_(compute) {}
  LayerStreamer(const LayerStreamer&) = delete;
  LayerStreamer& operator=(const LayerStreamer&) = delete;

  // Takes layer `index`'s frozen tensors (norms, projections dense or NF4, biases, router, experts)
  // into one host buffer (pinned for a GPU) and points the layer at it; its former copies are
  // dropped. Call once per streamed layer, in any order, as the model loads. `layer` must outlive
  // this object and must not hold trainable base weights (full fine-tuning streams nothing).
  void adopt(int64_t index, DecoderLayer& layer);
  bool streamed(int64_t index) const { return entries_.count(index) > 0; }
  bool empty() const { return entries_.empty(); }

  // Makes layer `index`'s weights resident on the compute device (the compute stream waits for
  // their copy) and points the layer at them until its slot is next reused; then starts the copy of
  // the next streamed layer in `direction` (+1 up, -1 down) into the other slot.
  void acquire(int64_t index, int direction);

  Device compute_device() const { return compute_; }
  int64_t host_bytes() const;  // every streamed layer's buffer
  int64_t slot_bytes() const;  // one slot: the largest streamed layer
  int64_t copies() const { return copies_; }  // layer copies made so far (a prefetch hit costs none)

  // One frozen tensor of a layer's buffer.
  struct Piece {
    Shape shape;  // as stored: a weight with spare columns after its rows (Linear::widen) whole
    DType dtype;
    int64_t offset = 0;  // bytes into the layer's buffer
    int64_t cols = 0;    // > 0: the tensor is the first cols columns of the stored [rows, pitch]
  };

 private:
  struct Entry {
    DecoderLayer* layer = nullptr;
    std::vector<Piece> pieces;  // in for_each_frozen order
    Tensor host;                // u8 [bytes]
    int64_t bytes = 0;
  };
  struct Slot {
    Tensor buffer;  // u8 on the compute device, slot_bytes() long
    int64_t resident = -1;
    TransferEvent ready;
  };
  // Points e's layer at `storage` (its host buffer or a slot).
  void point(Entry& e, const Tensor& storage);
  void fill(int slot, int64_t index);
  int slot_of(int64_t index) const;

  Device compute_;
  std::map<int64_t, Entry> entries_;
  Slot slots_[2];
  int64_t last_ = -1;
  int64_t copies_ = 0;
};

// Every frozen tensor of a decoder layer in a fixed order; `fn` may replace the tensor it is given
// (same shape and dtype) and the layer then holds the replacement.
void for_each_frozen_tensor(DecoderLayer& layer, const std::function<void(Tensor&)>& fn);

}  // namespace loom
