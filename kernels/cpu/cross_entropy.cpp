// CPU reference for kernels/cross_entropy.h: two passes per row (max, then sum of exponentials),
// the sum accumulated in f64 so the reference stays accurate for 256k-entry vocabularies.
#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom::cpu {
namespace {

template <class A>
A capped(A x, float softcap) {
  return softcap > 0.f ? A(softcap) * std::tanh(x / A(softcap)) : x;
}

// Serially, before any parallel region (exceptions cannot leave one).
void check_inputs(const int32_t* targets, int64_t n, int64_t vocab, float softcap, int32_t ignore_index,
                  const char* op) {
  LOOM_CHECK(n >= 0 && vocab > 0, op, ": bad shape n=", n, " vocab=", vocab);
  LOOM_CHECK(softcap >= 0.f, op, ": softcap must be >= 0 (0 = off), got ", softcap);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = targets[i];
    LOOM_CHECK(t == ignore_index || (t >= 0 && t < vocab), op, ": target of row ", i, " is ", t,
               ", outside [0, ", vocab, ") and not ignore_index (", ignore_index, ")");
  }
}

}  // namespace

template <class T>
void cross_entropy_forward(const T* logits, const int32_t* targets, Acc<T>* loss, Acc<T>* lse, int64_t n,
                           int64_t vocab, float softcap, int32_t ignore_index) {
  using A = Acc<T>;
  check_inputs(targets, n, vocab, softcap, ignore_index, "cpu::cross_entropy_forward");
#pragma omp parallel for schedule(static) if (n * vocab > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * vocab;
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t v = 0; v < vocab; ++v) m = nan_max(m, capped(to_acc(row[v]), softcap));  // NaN stays NaN
    double sum = 0;
    if (m != -std::numeric_limits<A>::infinity())
      for (int64_t v = 0; v < vocab; ++v) sum += double(std::exp(capped(to_acc(row[v]), softcap) - m));
    lse[i] = sum != 0 ? m + static_cast<A>(std::log(sum)) : m;  // a NaN sum (an infinite logit) stays NaN
    const int32_t t = targets[i];
    loss[i] = t == ignore_index ? A(0) : lse[i] - capped(to_acc(row[t]), softcap);
  }
}

template <class T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const Acc<T>* lse, const Acc<T>* dloss,
                            T* dlogits, int64_t n, int64_t vocab, float softcap, int32_t ignore_index) {
  using A = Acc<T>;
  check_inputs(targets, n, vocab, softcap, ignore_index, "cpu::cross_entropy_backward");
#pragma omp parallel for schedule(static) if (n * vocab > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * vocab;
    T* grad = dlogits + i * vocab;
    const int32_t t = targets[i];
    if (t == ignore_index) {
      for (int64_t v = 0; v < vocab; ++v) grad[v] = from_acc<T>(A(0));
      continue;
    }
    for (int64_t v = 0; v < vocab; ++v) {
      const A x = to_acc(row[v]);
      A z = x, dz = 1;
      if (softcap > 0.f) {
        const A th = std::tanh(x / A(softcap));
        z = A(softcap) * th;
        dz = A(1) - th * th;
      }
      const A g = std::exp(z - lse[i]) - (v == t ? A(1) : A(0));
      grad[v] = from_acc<T>(dloss[i] * g * dz);
    }
  }
}

#define LOOM_INST(T)                                                                                      \
  template void cross_entropy_forward<T>(const T*, const int32_t*, Acc<T>*, Acc<T>*, int64_t, int64_t,    \
                                         float, int32_t);                                                 \
  template void cross_entropy_backward<T>(const T*, const int32_t*, const Acc<T>*, const Acc<T>*, T*,     \
                                          int64_t, int64_t, float, int32_t);
LOOM_INST(float)
LOOM_INST(double)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cpu
