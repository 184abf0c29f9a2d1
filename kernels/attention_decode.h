// Attention of one new token per sequence against a KV cache (generation). The query sits at
// position length-1 and sees cached keys max(0, length-window)..length-1; soft-capping and scale as
// in kernels/attention.h.
#pragma once
#include <cstdint>

#include "kernels/common.h"

namespace loom {
struct DecodeParams {
  int64_t batch = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t capacity = 0;  // cache rows per sequence
  int64_t length = 0;    // valid cache rows (the new token's k/v already written at length-1)
  float scale = 1.f, softcap = 0.f;
  int64_t window = 0;
};
}  // namespace loom

namespace loom::cpu {
// q [batch, heads, head_dim]; k, v [batch, capacity, kv_heads, head_dim]; out [batch, heads, head_dim].
template <class T>
void attention_decode(const DecodeParams& p, const T* q, const T* k, const T* v, T* out);
}  // namespace loom::cpu

namespace loom::cuda {
template <class T>
void attention_decode(const DecodeParams& p, const T* q, const T* k, const T* v, T* out, Stream s);
}  // namespace loom::cuda
