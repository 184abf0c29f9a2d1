// Forward passes of the building blocks (see layers.h).
#include "models/layers.h"

namespace loom {

ag::Variable Linear::forward(const ag::Variable& x) const {
  if (!lora) return ag::linear(x, weight, bias.defined() ? &bias : nullptr);
  // One fused function: bf16 GEMMs with f32 accumulation, B's product accumulated into the base
  // output by the GEMM (PEFT computes the adapter in f32 and adds it to the cast base output; the
  // family fixtures bound the difference by PyTorch's own bf16 error).
  ag::LoraArgs args{lora->scale, lora->dropout, lora->dropout_seed, lora->dropout_offset};
  return ag::lora_linear(x, weight, lora->A, lora->B, args, bias.defined() ? &bias : nullptr);
}

ag::Variable Mlp::forward(const ag::Variable& x) const {
  ag::Variable gate = gate_proj.forward(x), up = up_proj.forward(x);
  return down_proj.forward(gelu ? ag::geglu(gate, up) : ag::swiglu(gate, up));
}

}  // namespace loom
