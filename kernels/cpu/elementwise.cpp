// CPU reference for kernels/elementwise.h.
#include "kernels/elementwise.h"

#include <cmath>
#include <vector>

namespace loom::cpu {

template <class T>
void axpby(const T* a, const T* b, T* out, int64_t n, float alpha, float beta) {
  using A = Acc<T>;
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i)
    out[i] = from_acc<T>(A(alpha) * to_acc(a[i]) + A(beta) * to_acc(b[i]));
}

template <class T>
void mul(const T* a, const T* b, T* out, int64_t n) {
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = from_acc<T>(to_acc(a[i]) * to_acc(b[i]));
}

template <class T>
void scale(const T* a, T* out, int64_t n, float s) {
  using A = Acc<T>;
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = from_acc<T>(A(s) * to_acc(a[i]));
}

template <class T>
void add_bias(const T* a, const T* bias, T* out, int64_t rows, int64_t cols) {
#pragma omp parallel for if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = from_acc<T>(to_acc(a[r * cols + c]) + to_acc(bias[c]));
}

template <class T, class O>
void sum_rows(const T* a, O* out, int64_t rows, int64_t cols, bool accumulate) {
#pragma omp parallel for if (rows * cols > 65536)
  for (int64_t c = 0; c < cols; ++c) {
    double acc = accumulate ? double(to_acc(out[c])) : 0.0;
    for (int64_t r = 0; r < rows; ++r) acc += double(to_acc(a[r * cols + c]));
    out[c] = from_acc<O>(static_cast<Acc<O>>(acc));
  }
}

template <class T>
void softcap_forward(const T* a, T* out, int64_t n, float cap) {
  using A = Acc<T>;
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = from_acc<T>(A(cap) * std::tanh(to_acc(a[i]) / A(cap)));
}

template <class T>
void softcap_backward(const T* a, const T* dout, T* da, int64_t n, float cap) {
  using A = Acc<T>;
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const A t = std::tanh(to_acc(a[i]) / A(cap));
    da[i] = from_acc<T>(to_acc(dout[i]) * (A(1) - t * t));
  }
}

template <class T>
void fill(T* out, int64_t n, float value) {
  const T v = from_acc<T>(static_cast<Acc<T>>(value));
  for (int64_t i = 0; i < n; ++i) out[i] = v;
}

template <class T>
void scale_blocks(T* out, int64_t block, const int32_t* blocks, int64_t count, float beta) {
  LOOM_CHECK(block >= 0 && count >= 0, "cpu scale_blocks: block = ", block, ", count = ", count);
  if (beta == 1.f) return;
  for (int64_t i = 0; i < count; ++i) {
    T* b = out + int64_t(blocks[i]) * block;
    if (beta == 0.f) fill(b, block, 0.f);
    else scale(b, b, block, beta);
  }
}

template <class S, class D>
void copy_strided(const S* src, const StridedLayout& l, D* dst) {
  int64_t numel = 1;
  for (int d = 0; d < l.ndim; ++d) numel *= l.shape[d];
#pragma omp parallel for if (numel > 65536)
  for (int64_t i = 0; i < numel; ++i) dst[i] = from_acc<D>(static_cast<Acc<D>>(to_acc(src[strided_offset(i, l)])));
}

void copy_strided_bytes(const void* src, const StridedLayout& l, void* dst, int elem_size) {
  int64_t numel = 1;
  for (int d = 0; d < l.ndim; ++d) numel *= l.shape[d];
  const auto* s = static_cast<const unsigned char*>(src);
  auto* o = static_cast<unsigned char*>(dst);
#pragma omp parallel for if (numel > 65536)
  for (int64_t i = 0; i < numel; ++i) memcpy(o + i * elem_size, s + strided_offset(i, l) * elem_size, elem_size);
}

template <class T>
void sum(const T* a, int64_t n, float* out) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += double(to_acc(a[i]));
  *out = static_cast<float>(acc);
}

template <class T>
void sum_squares(const T* a, int64_t n, float* out) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = double(to_acc(a[i]));
    acc += v * v;
  }
  *out = static_cast<float>(acc);
}

#define LOOM_INST(T)                                                              \
  template void axpby<T>(const T*, const T*, T*, int64_t, float, float);          \
  template void mul<T>(const T*, const T*, T*, int64_t);                          \
  template void scale<T>(const T*, T*, int64_t, float);                           \
  template void add_bias<T>(const T*, const T*, T*, int64_t, int64_t);            \
  template void sum_rows<T, T>(const T*, T*, int64_t, int64_t, bool);             \
  template void fill<T>(T*, int64_t, float);                                      \
  template void scale_blocks<T>(T*, int64_t, const int32_t*, int64_t, float);      \
  template void softcap_forward<T>(const T*, T*, int64_t, float);                 \
  template void softcap_backward<T>(const T*, const T*, T*, int64_t, float);      \
  template void sum<T>(const T*, int64_t, float*);                                \
  template void sum_squares<T>(const T*, int64_t, float*);
LOOM_INST(float)
LOOM_INST(double)
LOOM_INST(bf16)
#undef LOOM_INST
template void sum_rows<bf16, float>(const bf16*, float*, int64_t, int64_t, bool);

#define LOOM_COPY(S, D) template void copy_strided<S, D>(const S*, const StridedLayout&, D*);
#define LOOM_COPY_ALL(S) LOOM_COPY(S, float) LOOM_COPY(S, double) LOOM_COPY(S, bf16)
LOOM_COPY_ALL(float)
LOOM_COPY_ALL(double)
LOOM_COPY_ALL(bf16)
#undef LOOM_COPY_ALL
#undef LOOM_COPY

}  // namespace loom::cpu
