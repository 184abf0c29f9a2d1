// Token embedding lookup and its gradient: out[i, :] = table[ids[i], :]; the backward scatters
// dout rows back into an Acc<T> gradient table with +=.
#pragma once
#include <cstdint>

#include "kernels/common.h"

namespace loom::cpu {
// ids [n] int32, table [vocab, dim], out [n, dim]. Throws loom::Error naming the position and the
// value of any id outside [0, vocab).
template <class T>
void embedding_forward(const int32_t* ids, const T* table, T* out, int64_t n, int64_t vocab, int64_t dim);
// dtable [vocab, dim] += scatter of dout [n, dim] by ids. Same id check as the forward.
template <class T>
void embedding_backward(const int32_t* ids, const T* dout, Acc<T>* dtable, int64_t n, int64_t vocab, int64_t dim);
}  // namespace loom::cpu

namespace loom::cuda {
// Never reads or writes out of bounds: an id outside [0, vocab) gives a zero row in the forward
// and is skipped in the backward. The backward uses f32 atomics (order of repeated ids varies).
template <class T>
void embedding_forward(const int32_t* ids, const T* table, T* out, int64_t n, int64_t vocab, int64_t dim, Stream s);
template <class T>
void embedding_backward(const int32_t* ids, const T* dout, float* dtable, int64_t n, int64_t vocab, int64_t dim,
                        Stream s);
}  // namespace loom::cuda
