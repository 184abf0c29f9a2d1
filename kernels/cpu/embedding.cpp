// CPU reference for kernels/embedding.h: row gather and scatter-add, with every id checked
// before anything is written.
#include "kernels/embedding.h"

#include <cstring>

namespace loom::cpu {
namespace {

void check_ids(const char* op, const int32_t* ids, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i)
    LOOM_CHECK(ids[i] >= 0 && ids[i] < vocab, op, ": id ", ids[i], " at position ", i, " is outside [0, ", vocab,
               ")");
}

}  // namespace

template <class T>
void embedding_forward(const int32_t* ids, const T* table, T* out, int64_t n, int64_t vocab, int64_t dim) {
  LOOM_CHECK(n >= 0 && vocab > 0 && dim > 0, "embedding_forward: bad shape n=", n, " vocab=", vocab, " dim=", dim);
  check_ids("embedding_forward", ids, n, vocab);
#pragma omp parallel for if (n * dim > 65536)
  for (int64_t i = 0; i < n; ++i) memcpy(out + i * dim, table + int64_t(ids[i]) * dim, dim * sizeof(T));
}

template <class T>
void embedding_backward(const int32_t* ids, const T* dout, Acc<T>* dtable, int64_t n, int64_t vocab, int64_t dim) {
  LOOM_CHECK(n >= 0 && vocab > 0 && dim > 0, "embedding_backward: bad shape n=", n, " vocab=", vocab, " dim=", dim);
  check_ids("embedding_backward", ids, n, vocab);
  // Parallel over column chunks so repeated ids never race; rows are added in order i = 0..n-1.
  constexpr int64_t kChunk = 256;
  const int64_t chunks = (dim + kChunk - 1) / kChunk;
#pragma omp parallel for if (n * dim > 65536)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t c0 = k * kChunk, c1 = c0 + kChunk < dim ? c0 + kChunk : dim;
    for (int64_t i = 0; i < n; ++i) {
      Acc<T>* dst = dtable + int64_t(ids[i]) * dim;
      const T* src = dout + i * dim;
      for (int64_t c = c0; c < c1; ++c) dst[c] += to_acc(src[c]);
    }
  }
}

#define LOOM_INST(T)                                                                                  \
  template void embedding_forward<T>(const int32_t*, const T*, T*, int64_t, int64_t, int64_t);       \
  template void embedding_backward<T>(const int32_t*, const T*, Acc<T>*, int64_t, int64_t, int64_t);
LOOM_INST(float)
LOOM_INST(double)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cpu
