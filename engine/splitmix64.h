// splitmix64 (Steele, Lea, Flood 2014): a 64-bit generator whose output is defined bit for bit,
// unlike the standard library's distributions, whose results differ between implementations. Used
// for data order, sampling, and as a hash that spreads seeds into independent streams.
#pragma once
#include <cstdint>

namespace loom {

// Advances *state and returns the next output.
inline uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace loom
