// CPU reference for kernels/dropout.h.
#include "kernels/dropout.h"

namespace loom::cpu {

template <class T>
void dropout(const T* x, T* out, int64_t n, float p, uint64_t seed, uint64_t offset) {
  LOOM_CHECK(p >= 0.f && p < 1.f, "dropout: p must be in [0, 1), got ", p);
  using A = Acc<T>;
  const A scale = A(1) / (A(1) - A(p));
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i)
    out[i] = dropout_keep(seed, offset, i, p) ? from_acc<T>(to_acc(x[i]) * scale) : from_acc<T>(A(0));
}

template void dropout<float>(const float*, float*, int64_t, float, uint64_t, uint64_t);
template void dropout<double>(const double*, double*, int64_t, float, uint64_t, uint64_t);
template void dropout<bf16>(const bf16*, bf16*, int64_t, float, uint64_t, uint64_t);

}  // namespace loom::cpu
