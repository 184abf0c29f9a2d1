// CPU reference for kernels/activation.h: SwiGLU and GeGLU (tanh GELU) forward and backward,
// computed in Acc<T> and rounded once per output.
#include "kernels/activation.h"

#include "kernels/cpu/eigen_exp.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom::cpu {
namespace {

// The activations run over chunks of this many elements: the transcendental of a chunk (SwiGLU's
// sigmoid, GeGLU's tanh) through Eigen's vectorised exp or tanh (libm's scalar expf was ~4 % of a
// SmolLM2 LoRA step on 2 cores), into aligned arrays, so an element takes Eigen's scalar path (the
// chunk's last n % packet) by its place in the chunk alone: forward and backward give it the same
// value, and the backward's value output the forward's bits.
constexpr int64_t kChunk = 4096;

template <class A>
using Chunk = EigenRow<A>;

// g[0, n) = gate in Acc, f[0, n) = sigmoid(g): exactly 0 where exp(-g) overflows (as 1 / (1 + inf)
// is with libm; Eigen's exp saturates at the largest finite value instead).
struct Sigmoid {
  template <class T, class A>
  static void chunk(const T* gate, int64_t n, Chunk<A>& g, Chunk<A>& f) {
    for (int64_t i = 0; i < n; ++i) g[i] = to_acc(gate[i]);
    f.head(n) = A(1) / (A(1) + (-g.head(n)).exp());
    const A tail = -std::log(std::numeric_limits<A>::max());
    for (int64_t i = 0; i < n; ++i) f[i] = g[i] < tail ? A(0) : f[i];
  }
};

// gelu_tanh(g) = 0.5 g (1 + t), t = tanh(k (g + c g^3)), k = sqrt(2 / pi), c = 0.044715.
constexpr double kGeluK = 0.7978845608028654, kGeluC = 0.044715;

// g[0, n) = gate in Acc, f[0, n) = t above (NaN where g is: ActivationCpu.NanGateReachesOnlyItsOwnOutputs).
struct GeluTanh {
  template <class T, class A>
  static void chunk(const T* gate, int64_t n, Chunk<A>& g, Chunk<A>& f) {
    const A k = A(kGeluK), c = A(kGeluC);
    for (int64_t i = 0; i < n; ++i) g[i] = to_acc(gate[i]);
    f.head(n) = (k * (g.head(n) + c * g.head(n).cube())).tanh();
  }
};

// body(begin, n, g, f) over the chunks of [0, n), f = F's function of g; threads split the chunks
// when n is large.
template <class F, class T, class Body>
void over_chunks(const T* gate, int64_t n, Body&& body) {
  using A = Acc<T>;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel if (n > 65536)
  {
    Chunk<A> g(kChunk), f(kChunk);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t begin = c * kChunk, len = std::min(kChunk, n - begin);
      F::chunk(gate + begin, len, g, f);
      body(begin, len, g, f);
    }
  }
}

}  // namespace

template <class T>
void swiglu_forward(const T* gate, const T* up, T* out, int64_t n) {
  using A = Acc<T>;
  over_chunks<Sigmoid>(gate, n, [&](int64_t begin, int64_t len, const Chunk<A>& g, const Chunk<A>& sg) {
    for (int64_t k = 0; k < len; ++k) out[begin + k] = from_acc<T>(g[k] * sg[k] * to_acc(up[begin + k]));
  });
}

template <class T>
void swiglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n, T* value) {
  using A = Acc<T>;
  over_chunks<Sigmoid>(gate, n, [&](int64_t begin, int64_t len, const Chunk<A>& gs, const Chunk<A>& sgs) {
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
  over_chunks<GeluTanh>(gate, n, [&](int64_t begin, int64_t len, const Chunk<A>& gs, const Chunk<A>& ts) {
    for (int64_t k = 0; k < len; ++k) out[begin + k] = from_acc<T>(A(0.5) * gs[k] * (A(1) + ts[k]) * to_acc(up[begin + k]));
  });
}

template <class T>
void geglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n, T* value) {
  using A = Acc<T>;
  const A k3 = A(kGeluK), c3 = A(3 * kGeluC);
  over_chunks<GeluTanh>(gate, n, [&](int64_t begin, int64_t len, const Chunk<A>& gs, const Chunk<A>& ts) {
    for (int64_t k = 0; k < len; ++k) {
      const int64_t i = begin + k;
      const A g = gs[k], t = ts[k], u = to_acc(up[i]), d = to_acc(dout[i]);
      const A v = A(0.5) * g * (A(1) + t);
      const A dv = A(0.5) * (A(1) + t) + A(0.5) * g * (A(1) - t * t) * k3 * (A(1) + c3 * g * g);
      dgate[i] = from_acc<T>(d * u * dv);
      dup[i] = from_acc<T>(d * v);
      if (value) value[i] = from_acc<T>(v * u);  // geglu_forward's expression and bits
    }
  });
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
