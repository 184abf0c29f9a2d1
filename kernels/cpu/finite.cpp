// CPU scan for NaN and infinity (kernels/finite.h): a vectorised count of exponent hits per chunk is
// the only pass over clean data; a chunk with a hit is searched again for its first one.
#include "kernels/finite.h"

#include <algorithm>
#include <cstring>

namespace loom::cpu {
namespace {

// Elements per chunk: long enough to run at memory speed, short enough to spread a large tensor
// over every core.
constexpr int64_t kChunk = int64_t{1} << 16;
// Threads only from here: one thread scans at memory speed (6 GB/s on the 2-core CI machine), and a
// parallel region per tensor costs more than the scan on a loaded machine, where it waits for
// descheduled threads: 75 tensors of a 120 MB model took 160-420 ms with 2 threads, 18 ms with one.
// A 7B model's layer weights (58 M elements) are past it.
constexpr int64_t kParallelFrom = int64_t{1} << 24;

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
#pragma omp parallel for schedule(static) reduction(min : first) if (n >= kParallelFrom)
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

// memcpy of each chunk, then the same test on the copy (hot in L2).
template <class U>
int64_t copy_first_all_ones(const void* src, void* dst, int64_t n, U exp) {
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  int64_t first = n;
#pragma omp parallel for schedule(static) reduction(min : first) if (n >= kParallelFrom)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    const int64_t at = lo * static_cast<int64_t>(sizeof(U));
    std::memcpy(d + at, s + at, static_cast<size_t>(hi - lo) * sizeof(U));
    uint32_t count = 0;
    for (int64_t i = lo; i < hi; ++i) count += static_cast<uint32_t>((bits_at<U>(d, i) & exp) == exp);
    if (count == 0) continue;
    for (int64_t i = lo; i < hi; ++i)
      if ((bits_at<U>(d, i) & exp) == exp) {
        first = std::min(first, i);
        break;
      }
  }
  return first == n ? -1 : first;
}

}  // namespace

int64_t copy_first_nonfinite(const void* src, void* dst, int64_t n, int bytes_per, bool kind_f16) {
  switch (bytes_per) {
    case 2: return copy_first_all_ones<uint16_t>(src, dst, n, kind_f16 ? 0x7c00u : 0x7f80u);
    case 4: return copy_first_all_ones<uint32_t>(src, dst, n, 0x7f800000u);
    case 8: return copy_first_all_ones<uint64_t>(src, dst, n, 0x7ff0000000000000ull);
  }
  LOOM_CHECK(false, "copy_first_nonfinite: elements of ", bytes_per, " bytes (expected 2, 4 or 8)");
  return -1;
}

int64_t first_nonfinite(const float* x, int64_t n) { return first_all_ones<uint32_t>(x, n, 0x7f800000u); }
int64_t first_nonfinite(const double* x, int64_t n) {
  return first_all_ones<uint64_t>(x, n, 0x7ff0000000000000ull);
}
int64_t first_nonfinite(const bf16* x, int64_t n) { return first_all_ones<uint16_t>(x, n, 0x7f80u); }
int64_t first_nonfinite_f16(const uint16_t* x, int64_t n) { return first_all_ones<uint16_t>(x, n, 0x7c00u); }

}  // namespace loom::cpu
