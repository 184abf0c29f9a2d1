// CUDA kernels for kernels/activation.h: grid-stride loops over 16-byte packs (scalar when a
// pointer is misaligned), the n % pack tail done by the first threads.
#include <cstdint>

#include "kernels/activation.h"
#include "kernels/cuda/cuda_common.cuh"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

// silu(g) = g sigmoid(g); expf(-g) overflows to inf for g < -88, giving sigmoid 0 (no NaN).
struct Silu {
  static __device__ __forceinline__ void eval(float g, float* value, float* deriv) {
    const float sg = 1.f / (1.f + expf(-g));
    *value = g * sg;
    *deriv = sg * (1.f + g * (1.f - sg));
  }
};

// PyTorch's gelu(approximate='tanh'): 0.5 g (1 + tanh(k (g + 0.044715 g^3))), k = sqrt(2/pi).
struct GeluTanh {
  static __device__ __forceinline__ void eval(float g, float* value, float* deriv) {
    const float k = 0.7978845608028654f, c = 0.044715f;
    const float t = tanhf(k * (g + c * g * g * g));
    *value = 0.5f * g * (1.f + t);
    *deriv = 0.5f * (1.f + t) + 0.5f * g * (1.f - t * t) * k * (1.f + 3.f * c * g * g);
  }
};

// out = act(gate) * up. Element-for-element aliasing of outputs and inputs is safe: each thread
// reads a pack before writing the same pack.
template <class Act, class T, int N>
__global__ void gated_forward_kernel(const T* gate, const T* up, T* out, int64_t n) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  for (int64_t p = tid; p < packs; p += int64_t(gridDim.x) * blockDim.x) {
    float g[N], u[N], o[N];
    load_vec<N>(gate + p * N, g);
    load_vec<N>(up + p * N, u);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float v, d;
      Act::eval(g[k], &v, &d);
      o[k] = v * u[k];
    }
    store_vec<N>(out + p * N, o);
  }
  const int64_t i = packs * N + tid;  // tail: fewer than N elements
  if (i < n) {
    float v, d;
    Act::eval(load(gate + i), &v, &d);
    store(out + i, v * load(up + i));
  }
}

// dgate = dout * up * act'(gate), dup = dout * act(gate), and (value non-null) act(gate) * up as
// gated_forward_kernel computes it. Outputs may alias inputs element for element.
template <class Act, class T, int N>
__global__ void gated_backward_kernel(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n,
                                      T* value) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  for (int64_t p = tid; p < packs; p += int64_t(gridDim.x) * blockDim.x) {
    float g[N], u[N], d[N], dg[N], du[N], o[N];
    load_vec<N>(gate + p * N, g);
    load_vec<N>(up + p * N, u);
    load_vec<N>(dout + p * N, d);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float v, dv;
      Act::eval(g[k], &v, &dv);
      dg[k] = d[k] * u[k] * dv;
      du[k] = d[k] * v;
      o[k] = v * u[k];
    }
    store_vec<N>(dgate + p * N, dg);
    store_vec<N>(dup + p * N, du);
    if (value) store_vec<N>(value + p * N, o);
  }
  const int64_t i = packs * N + tid;
  if (i < n) {
    float v, dv;
    Act::eval(load(gate + i), &v, &dv);
    const float d = load(dout + i), u = load(up + i);
    store(dgate + i, d * u * dv);
    store(dup + i, d * v);
    if (value) store(value + i, v * u);
  }
}

template <class Act, class T>
void forward(const T* gate, const T* up, T* out, int64_t n, Stream s) {
  LOOM_CHECK(n >= 0, "gated activation forward: bad n=", n);
  if (n == 0) return;
  constexpr int kN = kVecN<T>;
  if (aligned16(gate) && aligned16(up) && aligned16(out))
    gated_forward_kernel<Act, T, kN><<<blocks_for(n / kN, kThreads), kThreads, 0, s>>>(gate, up, out, n);
  else
    gated_forward_kernel<Act, T, 1><<<blocks_for(n, kThreads), kThreads, 0, s>>>(gate, up, out, n);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <class Act, class T>
void backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n, Stream s, T* value) {
  LOOM_CHECK(n >= 0, "gated activation backward: bad n=", n);
  if (n == 0) return;
  constexpr int kN = kVecN<T>;
  if (aligned16(gate) && aligned16(up) && aligned16(dout) && aligned16(dgate) && aligned16(dup) &&
      (!value || aligned16(value)))
    gated_backward_kernel<Act, T, kN><<<blocks_for(n / kN, kThreads), kThreads, 0, s>>>(gate, up, dout, dgate, dup,
                                                                                        n, value);
  else
    gated_backward_kernel<Act, T, 1><<<blocks_for(n, kThreads), kThreads, 0, s>>>(gate, up, dout, dgate, dup, n,
                                                                                  value);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <class T>
void swiglu_forward(const T* gate, const T* up, T* out, int64_t n, Stream s) {
  forward<Silu>(gate, up, out, n, s);
}
template <class T>
void swiglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n, Stream s, T* value) {
  backward<Silu>(gate, up, dout, dgate, dup, n, s, value);
}
template <class T>
void geglu_forward(const T* gate, const T* up, T* out, int64_t n, Stream s) {
  forward<GeluTanh>(gate, up, out, n, s);
}
template <class T>
void geglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n, Stream s, T* value) {
  backward<GeluTanh>(gate, up, dout, dgate, dup, n, s, value);
}

#define LOOM_INST(T)                                                                              \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t, Stream);                       \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, Stream, T*);    \
  template void geglu_forward<T>(const T*, const T*, T*, int64_t, Stream);                        \
  template void geglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, Stream, T*);
LOOM_INST(float)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cuda
