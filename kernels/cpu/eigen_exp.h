// Internal to the CPU kernels: Eigen (arrays, its vectorised exp) and exp_shifted, the softmax exps
// of attention and of the fused LM-head loss.
#pragma once
// GCC 12 warns that Eigen's AVX-512 packets "may be used uninitialized" inside its own headers
// (see kernels/cpu/gemm.cpp): not Loom's code, so the warning is off for the files that include this.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#include <cstdint>
#include <limits>

namespace loom::cpu {

template <class A>
using EigenRow = Eigen::Array<A, 1, Eigen::Dynamic>;

// out[c] = exp(x[c] - shift) for c < n: exactly 0 where x[c] is -inf, x[c] where it is NaN; out may
// be x, or ex's own data. Eigen 3.4 evaluates select() one element at a time with libm's exp (libm's
// scalar expf was 8-9 % of a SmolLM2 LoRA step on 2 cores), so the exps go alone through Eigen's
// vectorised exp into `ex`, and a plain loop picks. `ex` is Eigen's own aligned array (at least n
// long): Eigen takes the scalar exp for the elements before a destination's first vector-aligned
// address, so which elements those are depends on n alone, never on where malloc put a buffer, and a
// run's bits are the same from one run to the next.
template <class A>
void exp_shifted(const A* x, int64_t n, A shift, A* out, EigenRow<A>& ex) {
  ex.head(n) = (Eigen::Map<const EigenRow<A>>(x, n) - shift).exp();
  const A ninf = -std::numeric_limits<A>::infinity();
  for (int64_t c = 0; c < n; ++c) out[c] = x[c] == ninf ? A(0) : x[c] != x[c] ? x[c] : ex[c];
}

}  // namespace loom::cpu
