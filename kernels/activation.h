// Gated MLP activations: SwiGLU (Llama, Qwen) out = silu(gate) * up and GeGLU (Gemma)
// out = gelu_tanh(gate) * up, with gelu_tanh as PyTorch's approximate='tanh'. Elementwise over n.
#pragma once
#include <cstdint>

#include "kernels/common.h"

namespace loom::cpu {
// gate, up, out [n]. Outputs may alias inputs element for element.
template <class T> void swiglu_forward(const T* gate, const T* up, T* out, int64_t n);
// dgate = dout * up * silu'(gate), dup = dout * silu(gate); both overwritten. value (optional): the
// forward's output again, the same bits as swiglu_forward (a consumer's backward that needs it reads
// it from here instead of computing it apart). Outputs may alias inputs element for element.
template <class T>
void swiglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n, T* value = nullptr);
template <class T> void geglu_forward(const T* gate, const T* up, T* out, int64_t n);
template <class T>
void geglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n, T* value = nullptr);
}  // namespace loom::cpu

namespace loom::cuda {
template <class T> void swiglu_forward(const T* gate, const T* up, T* out, int64_t n, Stream s);
template <class T>
void swiglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n, Stream s,
                     T* value = nullptr);
template <class T> void geglu_forward(const T* gate, const T* up, T* out, int64_t n, Stream s);
template <class T>
void geglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n, Stream s,
                    T* value = nullptr);
}  // namespace loom::cuda
