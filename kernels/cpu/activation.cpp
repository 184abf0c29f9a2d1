// CPU reference for kernels/activation.h: SwiGLU and GeGLU (tanh GELU) forward and backward,
// computed in Acc<T> and rounded once per output.
#include "kernels/activation.h"

#include <cmath>

namespace loom::cpu {
namespace {

template <class A>
A sigmoid(A g) { return A(1) / (A(1) + std::exp(-g)); }

// gelu_tanh(g) = 0.5 g (1 + tanh(k (g + 0.044715 g^3))), k = sqrt(2 / pi); also its derivative.
template <class A>
void gelu_tanh(A g, A* value, A* deriv) {
  const A k = A(0.7978845608028654), c = A(0.044715);
  const A t = std::tanh(k * (g + c * g * g * g));
  *value = A(0.5) * g * (A(1) + t);
  if (deriv) *deriv = A(0.5) * (A(1) + t) + A(0.5) * g * (A(1) - t * t) * k * (A(1) + A(3) * c * g * g);
}

}  // namespace

template <class T>
void swiglu_forward(const T* gate, const T* up, T* out, int64_t n) {
  using A = Acc<T>;
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const A g = to_acc(gate[i]);
    out[i] = from_acc<T>(g * sigmoid(g) * to_acc(up[i]));
  }
}

template <class T>
void swiglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n, T* value) {
  using A = Acc<T>;
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const A g = to_acc(gate[i]), u = to_acc(up[i]), d = to_acc(dout[i]);
    const A sg = sigmoid(g);
    // silu'(g) = sg (1 + g (1 - sg))
    dgate[i] = from_acc<T>(d * u * sg * (A(1) + g * (A(1) - sg)));
    dup[i] = from_acc<T>(d * g * sg);
    if (value) value[i] = from_acc<T>(g * sg * u);  // swiglu_forward's expression and bits
  }
}

template <class T>
void geglu_forward(const T* gate, const T* up, T* out, int64_t n) {
  using A = Acc<T>;
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    A v;
    gelu_tanh<A>(to_acc(gate[i]), &v, nullptr);
    out[i] = from_acc<T>(v * to_acc(up[i]));
  }
}

template <class T>
void geglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n, T* value) {
  using A = Acc<T>;
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const A g = to_acc(gate[i]), u = to_acc(up[i]), d = to_acc(dout[i]);
    A v, dv;
    gelu_tanh<A>(g, &v, &dv);
    dgate[i] = from_acc<T>(d * u * dv);
    dup[i] = from_acc<T>(d * v);
    if (value) value[i] = from_acc<T>(v * u);  // geglu_forward's expression and bits (v does not depend on dv)
  }
}

#define LOOM_INST(T)                                                                         \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t);                          \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, T*);       \
  template void geglu_forward<T>(const T*, const T*, T*, int64_t);                           \
  template void geglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, T*);
LOOM_INST(float)
LOOM_INST(double)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cpu
