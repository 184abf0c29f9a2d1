// Points on a device's compute stream for timing where a step's time goes: the GPU time between
// two marks is how long the stream took from one to the other, idle stretches included (CUDA
// events with timing). On the CPU a mark is the host clock when it was recorded.
#pragma once
#include <memory>

#include "engine/device.h"

namespace loom {

class StreamMark {
 public:
  StreamMark() = default;
  // A mark after the work queued so far on `device`'s compute stream.
  static StreamMark record(Device device);
  bool recorded() const { return impl_ != nullptr; }
  // Milliseconds from `earlier` to `later` (both recorded, on one device); waits for `later`.
  static double elapsed_ms(const StreamMark& earlier, const StreamMark& later);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace loom
