// Which (query, key) pairs flash attention may see (kernels/attention.h's rule: causal, inside
// the window, same document), at three grains: a pair (Visibility), a tile pair (classify: skip,
// full or masked), and a thread's fragment of a wgmma accumulator (fragment_bits, mask_causal).
// Also the key tiles a query tile visits (QueryTileKeys, forward) and the query tiles a key tile
// visits (KeyTileItems, backward), and the soft-cap. FlashAttention-3's mask.h in Loom's terms.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/attention.h"

namespace loom::cuda::flash {

// Query i sees key j when j <= i, i - j < window (window > 0), and both share a segment.
struct Visibility {
  int64_t seq, window;
  const int32_t* seg;  // this batch row's segment ids or null
  __device__ __forceinline__ bool operator()(int64_t i, int64_t j) const {
    return j <= i && i < seq && (window <= 0 || i - j < window) && (seg == nullptr || seg[i] == seg[j]);
  }
};

// A forward block's rows: query head h of batch row b and its kv head, as [seq, stride] matrices
// of head_dim (hd) valid columns, and which keys each of its queries sees.
struct HeadRows {
  const bf16 *q, *k, *v;
  int64_t q_stride, kv_stride;
  int hd;
  const int32_t* seg;  // the batch row's segment ids or null
  Visibility vis;
  __device__ __forceinline__ HeadRows(const AttentionParams& p, const bf16* q_, const bf16* k_, const bf16* v_,
                                      int64_t b, int64_t h)
      : q(q_ + (b * p.seq * p.heads + h) * p.head_dim),
        k(k_ + (b * p.seq * p.kv_heads + h / (p.heads / p.kv_heads)) * p.head_dim),
        v(v_ + (b * p.seq * p.kv_heads + h / (p.heads / p.kv_heads)) * p.head_dim),
        q_stride(p.heads * p.head_dim), kv_stride(p.kv_heads * p.head_dim), hd(int(p.head_dim)),
        seg(p.segment_ids ? p.segment_ids + b * p.seq : nullptr), vis{p.seq, p.window, seg} {}
};

// How a (query tile, key tile) pair must be treated.
enum class TileKind { kSkip, kFull, kMasked };

// Segment id range of rows [r0, r0 + n) (clamped to seq); every lane of the warp gets it.
__device__ __forceinline__ void warp_seg_range(const int32_t* seg, int64_t r0, int n, int64_t seq, int lane,
                                               int32_t* lo, int32_t* hi) {
  int32_t mn = INT32_MAX, mx = INT32_MIN;
  for (int t = lane; t < n; t += 32) {
    if (r0 + t < seq) {
      const int32_t s = seg[r0 + t];
      mn = min(mn, s);
      mx = max(mx, s);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  }
  *lo = mn;
  *hi = mx;
}

// Classifies queries [q0, q0 + nq) against keys [k0, k0 + nk): skip when no pair can be visible,
// full when every pair with both ends inside [0, seq) is visible, masked otherwise. qs/ks are
// the tiles' segment-id ranges (ignored without segments).
__device__ __forceinline__ TileKind classify(const AttentionParams& p, int64_t q0, int nq, int64_t k0, int nk,
                                             int32_t qs_lo, int32_t qs_hi, int32_t ks_lo, int32_t ks_hi) {
  const int64_t q1 = q0 + nq - 1, k1 = k0 + nk - 1;  // last query, last key of the tiles
  if (k0 > q1) return TileKind::kSkip;                                  // every key after every query
  if (p.window > 0 && q0 - k1 >= p.window) return TileKind::kSkip;      // every key out of the window
  if (p.segment_ids && (ks_hi < qs_lo || ks_lo > qs_hi)) return TileKind::kSkip;  // no shared segment
  const bool causal_ok = k1 <= q0;
  const bool window_ok = p.window <= 0 || q1 - k0 < p.window;
  const bool seg_ok = !p.segment_ids || (qs_lo == qs_hi && ks_lo == ks_hi && qs_lo == ks_lo);
  const bool in_range = q1 < p.seq && k1 < p.seq;
  return causal_ok && window_ok && seg_ok && in_range ? TileKind::kFull : TileKind::kMasked;
}

// First key tile (of kBc keys) at or after t that is not skipped for queries [q0, q0 + kBr); its
// kind in *kind. Returns t_end when there is none.
template <int kBr, int kBc>
__device__ __forceinline__ int next_key_tile(const AttentionParams& p, const int32_t* seg, int t, int t_end, int64_t q0,
                                             int32_t qs_lo, int32_t qs_hi, int lane, TileKind* kind) {
  for (; t < t_end; ++t) {
    int32_t lo = 0, hi = 0;
    if (seg) warp_seg_range(seg, int64_t(t) * kBc, kBc, p.seq, lane, &lo, &hi);
    *kind = classify(p, q0, kBr, int64_t(t) * kBc, kBc, qs_lo, qs_hi, lo, hi);
    if (*kind != TileKind::kSkip) break;
  }
  return t;
}

// Backward: the first (head-in-group, query tile of kBr rows) item at or after idx that is not
// skipped for keys [k0, k0 + kBc); items run over query tiles [qt0, qt0 + nqt) for each head of the
// group. Returns n_items when there is none.
template <int kBr, int kBc>
__device__ __forceinline__ int next_item(const AttentionParams& p, const int32_t* seg, int idx, int n_items, int qt0,
                                         int nqt, int64_t k0, int32_t ks_lo, int32_t ks_hi, int lane, TileKind* kind) {
  for (; idx < n_items; ++idx) {
    const int64_t q0 = int64_t(qt0 + idx % nqt) * kBr;
    int32_t lo = 0, hi = 0;
    if (seg) warp_seg_range(seg, q0, kBr, p.seq, lane, &lo, &hi);
    *kind = classify(p, q0, kBr, k0, kBc, lo, hi, ks_lo, ks_hi);
    if (*kind != TileKind::kSkip) break;
  }
  return idx;
}

// The key tiles of kBc keys that queries [q0, q0 + kBr) may see: from the window's first key
// (k_begin) to the last query or seq (tile t_end excluded); next() skips what classify() rules out.
template <int kBr, int kBc>
struct QueryTileKeys {
  int64_t q0, k_begin;
  int t_end;
  int32_t qs_lo = 0, qs_hi = 0;  // the queries' segment-id range (with segments)
  __device__ __forceinline__ QueryTileKeys(const AttentionParams& p, const int32_t* seg, int64_t q0_, int lane)
      : q0(q0_) {
    const int64_t k_end = q0 + kBr < p.seq ? q0 + kBr : p.seq;  // keys [k_begin, k_end) can be seen
    k_begin = p.window > 0 && q0 - p.window + 1 > 0 ? q0 - p.window + 1 : 0;
    t_end = int((k_end + kBc - 1) / kBc);
    if (seg) warp_seg_range(seg, q0, kBr, p.seq, lane, &qs_lo, &qs_hi);
  }
  // The first tile at or after t that is not skipped (its kind in *kind), or t_end.
  __device__ __forceinline__ int next(const AttentionParams& p, const int32_t* seg, int t, int lane,
                                      TileKind* kind) const {
    return next_key_tile<kBr, kBc>(p, seg, t, t_end, q0, qs_lo, qs_hi, lane, kind);
  }
  __device__ __forceinline__ int first(const AttentionParams& p, const int32_t* seg, int lane, TileKind* kind) const {
    return next(p, seg, int(k_begin / kBc), lane, kind);
  }
};

// The items a backward block of kBc keys from k0 visits: the query tiles of kBr rows that may see
// them ([k0, q_end), q_end the window's reach or seq), for each query head of the kv head's group
// in turn; next() skips what classify() rules out.
template <int kBr, int kBc>
struct KeyTileItems {
  int64_t group;  // query heads per kv head
  int qt0, nqt, n_items;
  int32_t ks_lo = 0, ks_hi = 0;  // the keys' segment-id range (with segments)
  __device__ __forceinline__ KeyTileItems(const AttentionParams& p, const int32_t* seg, int64_t k0, int lane)
      : group(p.heads / p.kv_heads) {
    const int64_t q_end = p.window > 0 && k0 + kBc - 1 + p.window < p.seq ? k0 + kBc - 1 + p.window : p.seq;
    qt0 = int(k0 / kBr);
    nqt = int((q_end + kBr - 1) / kBr) - qt0;
    n_items = int(group) * nqt;
    if (seg) warp_seg_range(seg, k0, kBc, p.seq, lane, &ks_lo, &ks_hi);
  }
  __device__ __forceinline__ int64_t head(int64_t g, int item) const { return g * group + item / nqt; }
  __device__ __forceinline__ int64_t q_start(int item) const { return int64_t(qt0 + item % nqt) * kBr; }
  // The first item at or after idx that is not skipped (its kind in *kind), or n_items.
  __device__ __forceinline__ int next(const AttentionParams& p, const int32_t* seg, int idx, int64_t k0, int lane,
                                      TileKind* kind) const {
    return next_item<kBr, kBc>(p, seg, idx, n_items, qt0, nqt, k0, ks_lo, ks_hi, lane, kind);
  }
  __device__ __forceinline__ int first(const AttentionParams& p, const int32_t* seg, int64_t k0, int lane,
                                       TileKind* kind) const {
    return nqt > 0 ? next(p, seg, 0, k0, lane, kind) : n_items;
  }
};

// ---- a thread's fragment of a wgmma m64nN accumulator: rows row0 and row0 + 8 (r = 0, 1),
// columns 8 n + col0 + {0, 1}, element 4 n + 2 r + {0, 1} ----

// Visibility of the fragment's kCols columns as bits: bit 2 n + e % 2 of bits[r] says whether
// column 8 n + col0 + e % 2 of row r is visible, seen(r, column) deciding each, in a loop that
// is not unrolled (a window or documents make the rule long).
template <int kCols, class Seen>
__device__ __forceinline__ void fragment_bits(uint32_t (&bits)[2], int col0, Seen seen) {
  static_assert(kCols / 4 <= 32, "one 32-bit mask per row");
  bits[0] = bits[1] = 0u;
#pragma unroll 1
  for (int c = 0; c < kCols / 4; ++c) {
    const int col = (c >> 1) * 8 + col0 + (c & 1);
    bits[0] |= uint32_t(seen(0, col)) << c;
    bits[1] |= uint32_t(seen(1, col)) << c;
  }
}
__device__ __forceinline__ bool fragment_bit(const uint32_t (&bits)[2], int n, int e) {
  return (bits[e >> 1] >> (2 * n + (e & 1))) & 1u;
}

// S = -inf where the fragment's bit (fragment_bits) is clear.
template <int kNs>
__device__ __forceinline__ void mask_bits(float (&sacc)[4 * kNs], const uint32_t (&bits)[2]) {
#pragma unroll
  for (int n = 0; n < kNs; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (!fragment_bit(bits, n, e)) sacc[4 * n + e] = -INFINITY;
}

// Causal mask of the tile of keys from k0: key offset n * 8 + e % 2 is visible while <= d0 + 8 (e / 2),
// with d0 = row0 - k0 - col0.
template <int kNs>
__device__ __forceinline__ void mask_causal(float (&sacc)[4 * kNs], int d0) {
#pragma unroll
  for (int n = 0; n < kNs; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (n * 8 + (e & 1) > d0 + 8 * (e >> 1)) sacc[4 * n + e] = -INFINITY;
}

// mask_causal with a window as well (window > 0): key offset c of element e is visible while
// d0 + 8 (e / 2) - window < c <= d0 + 8 (e / 2).
template <int kNs>
__device__ __forceinline__ void mask_causal_window(float (&sacc)[4 * kNs], int d0, int window) {
#pragma unroll
  for (int n = 0; n < kNs; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = n * 8 + (e & 1), last = d0 + 8 * (e >> 1);
      if (c > last || c <= last - window) sacc[4 * n + e] = -INFINITY;
    }
}

// Soft-capping in the units of the raw q.k dot product, so that the kernels keep multiplying by
// scale * log2(e) afterwards: returns dot' with scale * dot' = softcap * tanh(scale * dot / softcap)
// and sets *dcap = d(capped) / d(scaled) = 1 - tanh^2. Without a cap: dot unchanged, dcap = 1.
__device__ __forceinline__ float cap_dot(float dot, float scale, float softcap, float* dcap) {
  if (softcap > 0.f) {
    const float t = tanhf(dot * (scale / softcap));
    *dcap = 1.f - t * t;
    return t * (softcap / scale);
  }
  *dcap = 1.f;
  return dot;
}

}  // namespace loom::cuda::flash
