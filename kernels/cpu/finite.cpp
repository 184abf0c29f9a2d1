// CPU scan for NaN and infinity (kernels/finite.h): a vectorised count of exponent hits per chunk is
// the only pass over clean data; a chunk with a hit is searched again for its first one.
#include "kernels/finite.h"

#include <algorithm>
#include <cstring>

namespace loom::cpu {
namespace {

// Elements per chunk: long enough to run at memory speed, short enough that a 100 MB tensor
// spreads over every core.
constexpr int64_t kChunk = int64_t{1} << 16;

// The element at i of a buffer of U bit patterns (memcpy: the buffer holds floats, and the
// compiler turns this into one load).
template <class U>
U bits_at(const unsigned char* p, int64_t i) {
  U u;
  std::memcpy(&u, p + i * static_cast<int64_t>(sizeof(U)), sizeof(U));
  return u;
}

// The first of n elements whose exponent bits (mask `exp`) are all ones: NaN or infinity.
template <class U>
int64_t first_all_ones(const void* data, int64_t n, U exp) {
  const auto* p = static_cast<const unsigned char*>(data);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  int64_t first = n;
#pragma omp parallel for schedule(static) reduction(min : first) if (n > 4 * kChunk)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    uint32_t count = 0;  // up to kChunk hits: 32 bits never wrap
    for (int64_t i = lo; i < hi; ++i) count += static_cast<uint32_t>((bits_at<U>(p, i) & exp) == exp);
    if (count == 0) continue;
    for (int64_t i = lo; i < hi; ++i)
      if ((bits_at<U>(p, i) & exp) == exp) {
        first = std::min(first, i);
        break;
      }
  }
  return first == n ? -1 : first;
}

}  // namespace

int64_t first_nonfinite(const float* x, int64_t n) { return first_all_ones<uint32_t>(x, n, 0x7f800000u); }
int64_t first_nonfinite(const double* x, int64_t n) {
  return first_all_ones<uint64_t>(x, n, 0x7ff0000000000000ull);
}
int64_t first_nonfinite(const bf16* x, int64_t n) { return first_all_ones<uint16_t>(x, n, 0x7f80u); }
int64_t first_nonfinite_f16(const uint16_t* x, int64_t n) { return first_all_ones<uint16_t>(x, n, 0x7c00u); }

}  // namespace loom::cpu
