// Forward passes of the building blocks (see layers.h).
#include "models/layers.h"

namespace loom {

ag::Variable Linear::forward(const ag::Variable& x) const {
  ag::Variable y = ag::linear(x, weight, bias.defined() ? &bias : nullptr);
  if (!lora) return y;
  // PEFT: x is cast to the adapter's dtype (f32), lora_B(lora_A(dropout(x))) * scaling is added
  // to the base output in f32, and the sum is cast back to the base output's dtype.
  const DType out_dtype = y.dtype();
  ag::Variable xf = ag::dropout(ag::cast(x, DType::f32), lora->dropout, lora->dropout_seed, lora->dropout_offset);
  ag::Variable delta = ag::scale(ag::linear(ag::linear(xf, lora->A), lora->B), lora->scale);
  return ag::cast(ag::add(ag::cast(y, DType::f32), delta), out_dtype);
}

ag::Variable Mlp::forward(const ag::Variable& x) const {
  ag::Variable gate = gate_proj.forward(x), up = up_proj.forward(x);
  return down_proj.forward(gelu ? ag::geglu(gate, up) : ag::swiglu(gate, up));
}

}  // namespace loom
