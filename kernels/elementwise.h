// Elementwise kernels and reductions: add, mul, scale, add-bias, fill, strided copy with cast,
// sum, column sums, sum of squares. T is float, double (CPU only) or bf16; results are computed
// in Acc<T> and rounded once to T.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/common.h"

namespace loom {

// Up to this many dimensions for strided copies.
inline constexpr int kMaxDims = 8;
struct StridedLayout {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements
};

// The storage offset of the i-th element (row-major order over layout.shape).
LOOM_HD int64_t strided_offset(int64_t i, const StridedLayout& l) {
  int64_t off = 0;
  for (int d = l.ndim - 1; d >= 0; --d) {
    off += (i % l.shape[d]) * l.strides[d];
    i /= l.shape[d];
  }
  return off;
}

}  // namespace loom

namespace loom::cpu {
// out[i] = alpha * a[i] + beta * b[i]   (add: 1,1; sub: 1,-1)
template <class T> void axpby(const T* a, const T* b, T* out, int64_t n, float alpha, float beta);
// out[i] = a[i] * b[i]
template <class T> void mul(const T* a, const T* b, T* out, int64_t n);
// out[i] = s * a[i]
template <class T> void scale(const T* a, T* out, int64_t n, float s);
// out[r, c] = a[r, c] + bias[c] for a [rows, cols]
template <class T> void add_bias(const T* a, const T* bias, T* out, int64_t rows, int64_t cols);
// out[c] = (accumulate ? out[c] : 0) + sum_r a[r, c]   (out in f32 or T)
template <class T, class O> void sum_rows(const T* a, O* out, int64_t rows, int64_t cols, bool accumulate);
template <class T> void fill(T* out, int64_t n, float value);
// Blocks blocks[0 .. count) of `block` elements each (block b is out[b * block, (b + 1) * block)) scaled
// by beta in place; beta 0 writes zeros without reading (C = beta C of an empty product: what a
// mixture-of-experts weight gradient leaves an expert without rows), beta 1 leaves them as they are.
template <class T> void scale_blocks(T* out, int64_t block, const int32_t* blocks, int64_t count, float beta);
// dst (contiguous, numel = prod(shape)) = cast(src viewed through layout)
template <class S, class D> void copy_strided(const S* src, const StridedLayout& layout, D* dst);
// Same-dtype strided copy for any element size (1, 2, 4 or 8 bytes): integer tensors use this.
void copy_strided_bytes(const void* src, const StridedLayout& layout, void* dst, int elem_size);
// Soft-capping (Gemma 2 logits): out = cap * tanh(a / cap); backward da = dout * (1 - tanh^2(a / cap)).
template <class T> void softcap_forward(const T* a, T* out, int64_t n, float cap);
template <class T> void softcap_backward(const T* a, const T* dout, T* da, int64_t n, float cap);
// *out = sum(a) and *out = sum(a^2), accumulated in f64 on the CPU.
template <class T> void sum(const T* a, int64_t n, float* out);
template <class T> void sum_squares(const T* a, int64_t n, float* out);
}  // namespace loom::cpu

namespace loom::cuda {
// Scratch the reductions need: kReduceWorkspaceFloats floats, given by the caller.
inline constexpr int kReduceWorkspaceFloats = 1024;
template <class T> void axpby(const T* a, const T* b, T* out, int64_t n, float alpha, float beta, Stream s);
template <class T> void mul(const T* a, const T* b, T* out, int64_t n, Stream s);
template <class T> void scale(const T* a, T* out, int64_t n, float sc, Stream s);
template <class T> void add_bias(const T* a, const T* bias, T* out, int64_t rows, int64_t cols, Stream s);
// Column sums need sum_rows_workspace_bytes(rows, cols) bytes of scratch (0 for short matrices,
// where workspace may be nullptr); deterministic: a fixed split of the rows, combined in order.
size_t sum_rows_workspace_bytes(int64_t rows, int64_t cols);
template <class T, class O>
void sum_rows(const T* a, O* out, int64_t rows, int64_t cols, bool accumulate, void* workspace, Stream s);
template <class T> void fill(T* out, int64_t n, float value, Stream s);
// As the CPU version (blocks is host memory): one launch for up to kScaleBlocksPerLaunch blocks (their
// indices travel as a kernel argument, under the 4 KiB any architecture takes).
inline constexpr int kScaleBlocksPerLaunch = 960;
template <class T> void scale_blocks(T* out, int64_t block, const int32_t* blocks, int64_t count, float beta, Stream s);
template <class T> void softcap_forward(const T* a, T* out, int64_t n, float cap, Stream s);
template <class T> void softcap_backward(const T* a, const T* dout, T* da, int64_t n, float cap, Stream s);
template <class S, class D> void copy_strided(const S* src, const StridedLayout& layout, D* dst, Stream s);
void copy_strided_bytes(const void* src, const StridedLayout& layout, void* dst, int elem_size, Stream s);
// rows x row_bytes from src (rows src_pitch bytes apart) to dst (dst_pitch apart), 16 bytes a thread
// where every address and pitch allows: cudaMemcpy2DAsync's pitched device copies ran far under the
// memory's bandwidth for [out, in] weights (ops::cat_last, ops::copy_rows_).
void copy_2d(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes, int64_t rows,
             Stream s);
// *out (device f32) = sum(a) / sum(a^2); deterministic two-pass reduction using workspace.
template <class T> void sum(const T* a, int64_t n, float* out, float* workspace, Stream s);
template <class T> void sum_squares(const T* a, int64_t n, float* out, float* workspace, Stream s);
}  // namespace loom::cuda
