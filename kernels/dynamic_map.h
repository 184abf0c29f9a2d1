// bitsandbytes' 8-bit dynamic quantisation map (functional.create_dynamic_map, 0.50), bit for bit:
// the code book of 8-bit AdamW's moments and of NF4's double-quantised absmax.
#pragma once

namespace loom {

// The 256 sorted values of create_dynamic_map(signed=is_signed, max_exponent_bits=7, total_bits=8).
// bitsandbytes builds it with torch.linspace on the CPU in f32, whose result depends on the
// SIMD width of PyTorch's CPU kernels (a few values differ by one ulp): torch_vec_width is
// Vectorized<float>::size() of the machine that made the reference (16 with AVX-512, 8 with AVX2
// or the default kernels; 0 = the scalar formula). The map is saved with the optimizer state, so
// a resumed run always reuses the one it started with.
void dynamic_map(bool is_signed, float out[256], int torch_vec_width = 16);

}  // namespace loom
