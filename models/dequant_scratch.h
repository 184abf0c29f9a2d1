// Buffers kept for weights dequantised on every use (QLoRA experts): a Qwen3-30B-A3B layer's
// gate_up experts are 805 MB in bf16, made in forward and again in backward and freed after each
// product. On the H200 the QLoRA offload row held 6.47 GiB in CUDA's stream-ordered pool for a peak of
// 4.99 GiB in use (bf16 LoRA: 11.56 for 11.43); such blocks, made and freed among the activations,
// are the likely cause (session 33, not yet confirmed). One buffer per shape, dtype and device,
// handed out again whenever nothing else holds it, keeps them out of the pool.
#pragma once
#include <mutex>
#include <vector>

#include "engine/tensor.h"

namespace loom {

class DequantScratch {
 public:
  // An uninitialised [shape] tensor of dtype on device: the kept buffer of that kind when no tensor
  // outside this scratch shares its storage (the last product that read it was queued before on the
  // device's compute stream, where the caller writes it: in stream order), else a new one that is
  // not kept. The caller overwrites every element.
  Tensor take(const Shape& shape, DType dtype, Device device);
  // Bytes the kept buffers hold.
  int64_t kept_bytes() const;
  // take() calls so far (tests: how many dequantisations a step makes).
  int64_t taken() const;

 private:
  mutable std::mutex mu_;
  std::vector<Tensor> kept_;
  int64_t taken_ = 0;
};

}  // namespace loom
