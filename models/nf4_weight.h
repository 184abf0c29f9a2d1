// Nf4Weight: one frozen Linear weight [out, in] stored in bitsandbytes' NF4 format (kernels/nf4.h):
// packed codes, double-quantised absmax, and what a quant_state records. Quantised one weight at a
// time on the weight's own device, dequantised on demand into a caller's (reusable) buffer.
#pragma once
#include <array>
#include <cstdint>
#include <optional>

#include "engine/ops.h"
#include "engine/tensor.h"

namespace loom {

struct Nf4Weight {
  Tensor packed;         // u8 [ceil(n / 2)] (Hugging Face stores it as [n / 2, 1])
  Tensor absmax;         // u8 [blocks] codes of nested_code when nested(); f32 [blocks] when plain
  Tensor nested_absmax;  // f32 [ceil(blocks / 256)]; undefined when plain
  Tensor nested_code;    // f32 [256]; undefined when plain
  float offset = 0.f;    // nested_offset
  std::array<float, 16> code{};  // quant_map: NF4's code book
  Shape shape;                   // the logical weight shape, [out, in]
  int64_t blocksize = 64;
  int64_t nested_blocksize = 256;
  DType dtype = DType::bf16;  // the weight's dtype when it was quantised (quant_state "dtype"; f16 too)

  // Quantises w (f32 or bf16; f16 weights are read as f32, exactly) on w's device with double
  // quantisation. Only this one weight is ever held in full precision, so a model quantises while
  // it streams in. `source_dtype` is what quant_state records (default: w's dtype).
  static Nf4Weight quantize(const Tensor& w, std::optional<DType> source_dtype = std::nullopt);

  bool defined() const { return packed.defined(); }
  bool nested() const { return nested_absmax.defined(); }
  int64_t numel() const { return numel_of(shape); }
  Device device() const { return packed.device(); }
  // Bytes held on the device: packed + absmax + nested absmax + nested code.
  int64_t bytes() const;
  // The tensors as ops::nf4_dequantize takes them (shared, no copy).
  ops::Nf4Parts parts() const;

  // out: f32 or bf16, contiguous, on device(), numel() elements (any shape; usually `shape`). Pass
  // the same scratch buffer layer after layer: nothing is allocated.
  void dequantize_into(Tensor& out) const;
  Tensor dequantize(DType dtype) const;  // [out, in]
  Nf4Weight to(Device device) const;     // copies the tensors; the rest as is
};

}  // namespace loom
