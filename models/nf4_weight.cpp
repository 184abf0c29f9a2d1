// Nf4Weight (models/nf4_weight.h): quantise, dequantise, move.
#include "models/nf4_weight.h"

#include "kernels/error.h"
#include "kernels/nf4.h"

namespace loom {

Nf4Weight Nf4Weight::quantize(const Tensor& w, std::optional<DType> source_dtype) {
  LOOM_CHECK(w.defined() && w.numel() > 0, "Nf4Weight::quantize: empty weight");
  LOOM_CHECK(w.dtype() == DType::f32 || w.dtype() == DType::bf16, "Nf4Weight::quantize: weight must be f32 or bf16, got ",
             w.str());
  ops::Nf4Parts q = ops::nf4_quantize(w, /*double_quant=*/true);
  Nf4Weight out;
  out.packed = std::move(q.packed);
  out.absmax = std::move(q.absmax);
  out.nested_absmax = std::move(q.nested_absmax);
  out.nested_code = std::move(q.nested_code);
  out.offset = q.offset;
  for (int i = 0; i < 16; ++i) out.code[i] = kNf4Code[i];
  out.shape = w.shape();
  out.blocksize = kNf4Block;
  out.nested_blocksize = kNf4NestedBlock;
  out.dtype = source_dtype.value_or(w.dtype());
  return out;
}

int64_t Nf4Weight::bytes() const {
  int64_t b = 0;
  for (const Tensor* t : {&packed, &absmax, &nested_absmax, &nested_code})
    if (t->defined()) b += t->nbytes();
  return b;
}

ops::Nf4Parts Nf4Weight::parts() const {
  ops::Nf4Parts p;
  p.packed = packed;
  p.absmax = absmax;
  p.nested_absmax = nested_absmax;
  p.nested_code = nested_code;
  p.offset = offset;
  return p;
}

void Nf4Weight::dequantize_into(Tensor& out) const {
  LOOM_CHECK(defined(), "Nf4Weight::dequantize_into: undefined weight");
  LOOM_CHECK(out.numel() == numel(), "Nf4Weight::dequantize_into: output ", out.str(), " for a weight of shape ",
             shape_str(shape));
  ops::nf4_dequantize_into(parts(), out);
}

Tensor Nf4Weight::dequantize(DType dt) const {
  Tensor out = Tensor::empty(shape, dt, device());
  dequantize_into(out);
  return out;
}

Nf4Weight Nf4Weight::to(Device d) const {
  Nf4Weight w = *this;
  for (Tensor* t : {&w.packed, &w.absmax, &w.nested_absmax, &w.nested_code})
    if (t->defined()) *t = t->to(d);
  return w;
}

}  // namespace loom
