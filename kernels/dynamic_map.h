// bitsandbytes' 8-bit dynamic quantisation map (functional.create_dynamic_map, 0.50), bit for bit:
// the code book of 8-bit AdamW's moments and of NF4's double-quantised absmax.
#pragma once

namespace loom {

// The 256 sorted values of create_dynamic_map(signed=is_signed, max_exponent_bits=7, total_bits=8),
// bit for bit with bitsandbytes (it builds them with torch.linspace on the CPU in f32; see the .cpp).
// The map is also saved with the optimizer state, so a resumed run always reuses its own.
void dynamic_map(bool is_signed, float out[256]);

}  // namespace loom
