// CPU reference for kernels/activation.h: SwiGLU and GeGLU (tanh GELU) forward and backward,
// computed in Acc<T> and rounded once per output.
#include "kernels/activation.h"

#include "kernels/cpu/eigen_exp.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom::cpu {
namespace {

// SwiGLU runs over chunks of this many elements: sigmoid(g) of a chunk through Eigen's vectorised
// exp (libm's scalar expf was ~4 % of a SmolLM2 LoRA step on 2 cores), into aligned arrays, so an
// element takes Eigen's scalar path (the chunk's last n % packet) by its place in the chunk alone:
// forward and backward give it the same sigmoid, and the backward's value output the forward's bits.
constexpr int64_t kChunk = 4096;

template <class A>
using Chunk = EigenRow<A>;

// g[0, n) = gate in Acc, sg[0, n) = sigmoid(g): exactly 0 where exp(-g) overflows (as 1 / (1 + inf)
// is with libm; Eigen's exp saturates at the largest finite value instead).
template <class T, class A>
void sigmoid_chunk(const T* gate, int64_t n, Chunk<A>& g, Chunk<A>& sg) {
  for (int64_t i = 0; i < n; ++i) g[i] = to_acc(gate[i]);
  sg.head(n) = A(1) / (A(1) + (-g.head(n)).exp());
  const A tail = -std::log(std::numeric_limits<A>::max());
  for (int64_t i = 0; i < n; ++i) sg[i] = g[i] < tail ? A(0) : sg[i];
}

// body(begin, n, g, sg) over the chunks of [0, n), threads splitting the chunks when n is large.
template <class T, class F>
void over_chunks(const T* gate, int64_t n, F&& body) {
  using A = Acc<T>;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel if (n > 65536)
  {
    Chunk<A> g(kChunk), sg(kChunk);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t begin = c * kChunk, len = std::min(kChunk, n - begin);
      sigmoid_chunk(gate + begin, len, g, sg);
      body(begin, len, g, sg);
    }
  }
}

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
  over_chunks(gate, n, [&](int64_t begin, int64_t len, const Chunk<A>& g, const Chunk<A>& sg) {
    for (int64_t k = 0; k < len; ++k) out[begin + k] = from_acc<T>(g[k] * sg[k] * to_acc(up[begin + k]));
  });
}

template <class T>
void swiglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n, T* value) {
  using A = Acc<T>;
  over_chunks(gate, n, [&](int64_t begin, int64_t len, const Chunk<A>& gs, const Chunk<A>& sgs) {
    for (int64_t k = 0; k < len; ++k) {
      const int64_t i = begin + k;
      const A g = gs[k], sg = sgs[k], u = to_acc(up[i]), d = to_acc(dout[i]);
      // silu'(g) = sg (1 + g (1 - sg))
      dgate[i] = from_acc<T>(d * u * sg * (A(1) + g * (A(1) - sg)));
      dup[i] = from_acc<T>(d * g * sg);
      if (value) value[i] = from_acc<T>(g * sg * u);  // swiglu_forward's expression and bits
    }
  });
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
