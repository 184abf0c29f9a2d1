// CPU attention (kernels/attention.h) a tile of query rows at a time: the scores of kBlock queries
// against every key they may see are one Eigen product, the softmax runs along the tile's rows with
// a vectorised exp, and P V is a second product; backward, per (batch, kv head), recomputes P from
// the saved log-sum-exp and forms dQ, dK and dV with four more. The row-at-a-time loops this
// replaces (scalar dot products and expf) took 28 % of a SmolLM2-135M LoRA step on 2 cores.
//
// Masks: a masked score is -inf and its probability exactly 0. A product that sums over a masked
// index (P V, dS K, dS^T Q, P^T dO) would still let a NaN or infinity in a masked operand through
// (0 * inf = NaN), so such elements are zeroed for the product and their terms added one at a time
// where they are visible: a non-finite input reaches exactly the outputs that see it.
#include "kernels/attention.h"

#include "kernels/cpu/eigen_exp.h"
#include "kernels/cpu/rope_angles.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace loom::cpu {
namespace {

template <class A>
using Mat = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class A>
using RowArray = Eigen::Map<EigenRow<A>>;

constexpr int64_t kBlock = 64;  // query rows per tile

// Index helpers for the [batch, seq, heads, head_dim] / [batch, heads, seq] layouts.
struct Layout {
  int64_t seq, heads, kv_heads, d, group;
  int64_t q(int64_t b, int64_t i, int64_t h) const { return ((b * seq + i) * heads + h) * d; }
  int64_t kv(int64_t b, int64_t j, int64_t g) const { return ((b * seq + j) * kv_heads + g) * d; }
  int64_t row(int64_t b, int64_t h, int64_t i) const { return (b * heads + h) * seq + i; }
};

Layout layout_of(const AttentionParams& p) { return {p.seq, p.heads, p.kv_heads, p.head_dim, p.heads / p.kv_heads}; }

// First key query i may see; the last is i itself.
int64_t first_key(const AttentionParams& p, int64_t i) { return p.window > 0 ? std::max<int64_t>(0, i - p.window + 1) : 0; }

bool same_segment(const AttentionParams& p, int64_t b, int64_t i, int64_t j) {
  return p.segment_ids == nullptr || p.segment_ids[b * p.seq + i] == p.segment_ids[b * p.seq + j];
}

bool visible(const AttentionParams& p, int64_t b, int64_t i, int64_t j) {
  return j <= i && j >= first_key(p, i) && same_segment(p, b, i, j);
}

// 16 independent partial sums added in a fixed order at the end (vectorised without reassociation).
template <class T>
Acc<T> dot(const T* a, const T* b, int64_t d) {
  constexpr int kLanes = 16;
  Acc<T> lane[kLanes] = {};
  int64_t x = 0;
  for (; x + kLanes <= d; x += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += to_acc(a[x + l]) * to_acc(b[x + l]);
  Acc<T> acc = 0;
  for (; x < d; ++x) acc += to_acc(a[x]) * to_acc(b[x]);
  for (int l = 0; l < kLanes; ++l) acc += lane[l];
  return acc;
}

// n rows of d elements, `stride` elements apart, into dst's first n rows in the compute type.
template <class T, class A>
void gather(const T* x, int64_t stride, int64_t n, int64_t d, Mat<A>& dst) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < d; ++c) dst(r, c) = to_acc(x[r * stride + c]);
}

// The elements (row, column) among x's first n rows that are NaN or infinite, copied into clean
// with those elements zeroed (clean is left alone when there are none: the caller then multiplies
// by x itself). Only those elements leave the product, so every other output keeps its bits.
struct Bad {
  int64_t row, col;
};
template <class A>
std::vector<Bad> nonfinite(const Mat<A>& x, int64_t n, Mat<A>& clean) {
  std::vector<Bad> bad;
  for (int64_t r = 0; r < n; ++r)
    if (!x.row(r).allFinite())
      for (int64_t c = 0; c < x.cols(); ++c)
        if (!std::isfinite(x(r, c))) bad.push_back({r, c});
  if (bad.empty()) return bad;
  clean.resize(x.rows(), x.cols());
  clean.topRows(n) = x.topRows(n);
  for (const Bad& e : bad) clean(e.row, e.col) = 0;
  return bad;
}

// Scaled, optionally capped logits of one tile row in place (s <- cap(scale * s)); dcap, when
// given, receives d(capped)/d(scaled).
template <class A>
void logits(A* s, int64_t n, const AttentionParams& p, A* dcap) {
  RowArray<A> row(s, n);
  row *= A(p.scale);
  if (p.softcap <= 0.f) {
    if (dcap) RowArray<A>(dcap, n).setConstant(A(1));
    return;
  }
  for (int64_t c = 0; c < n; ++c) {
    const A t = std::tanh(s[c] / A(p.softcap));
    if (dcap) dcap[c] = A(1) - t * t;
    s[c] = A(p.softcap) * t;
  }
}

// -inf at the masked columns among row's first n: query i's scores against keys k0, k0 + 1, ...
template <class A>
void mask_row(A* row, int64_t n, const AttentionParams& p, int64_t b, int64_t i, int64_t k0) {
  for (int64_t c = 0; c < n; ++c)
    if (!visible(p, b, i, k0 + c)) row[c] = -std::numeric_limits<A>::infinity();
}

// The transpose of q's rotation (RopeOfQ) on n rows of dq in place, row r being token t0 + r:
// rope_backward's arithmetic (rope_cos_sin), without its rounding to T in between.
template <class A>
void rotate_back(const RopeOfQ& rope, int64_t t0, int64_t n, Mat<A>& dq) {
  const int64_t half = rope.rotary_dim / 2;
  for (int64_t r = 0; r < n; ++r) {
    const float pos = static_cast<float>(rope.positions[t0 + r]);
    for (int64_t i = 0; i < half; ++i) {
      A c, sn;
      rope_cos_sin<-1>(pos, rope.inv_freq[i], rope.mscale, c, sn);
      const A x1 = dq(r, i), x2 = dq(r, i + half);
      dq(r, i) = x1 * c - x2 * sn;
      dq(r, i + half) = x2 * c + x1 * sn;
    }
  }
}

}  // namespace

template <class T>
void attention_forward(const AttentionParams& p, const T* q, const T* k, const T* v, T* out, Acc<T>* lse) {
  using A = Acc<T>;
  check_attention_params(p, "cpu::attention_forward");
  const Layout L = layout_of(p);
  const int64_t d = p.head_dim, blocks = (p.seq + kBlock - 1) / kBlock, tasks = p.batch * p.heads * blocks;
  const A inf = std::numeric_limits<A>::infinity(), nan = std::numeric_limits<A>::quiet_NaN();
  // Threads only when there is work for them: a parallel region per tiny call costs more than the
  // call, and far more on a loaded machine where every region waits for all of its threads.
#pragma omp parallel if (p.batch * p.heads * p.seq * p.seq * d > 65536)
  {
    Mat<A> qb(kBlock, d), kb(p.seq, d), vb(p.seq, d), v_clean, s(kBlock, p.seq), o(kBlock, d);
    EigenRow<A> ex(p.seq);
    std::vector<A> m(kBlock), sum(kBlock);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      // Later tiles see more keys: they are handed out first.
      const int64_t blk = blocks - 1 - t % blocks, h = (t / blocks) % p.heads, b = t / (blocks * p.heads);
      const int64_t g = h / L.group, i0 = blk * kBlock, n = std::min(kBlock, p.seq - i0);
      const int64_t k0 = first_key(p, i0), nk = i0 + n - k0;
      gather(q + L.q(b, i0, h), p.heads * d, n, d, qb);
      gather(k + L.kv(b, k0, g), p.kv_heads * d, nk, d, kb);
      gather(v + L.kv(b, k0, g), p.kv_heads * d, nk, d, vb);
      auto S = s.topLeftCorner(n, nk);
      S.noalias() = qb.topRows(n) * kb.topRows(nk).transpose();
      for (int64_t r = 0; r < n; ++r) {
        const int64_t i = i0 + r;
        A* row = &s(r, 0);
        logits(row, nk, p, static_cast<A*>(nullptr));
        mask_row(row, nk, p, b, i, k0);
        A mx = -inf;
        for (int64_t c = 0; c < nk; ++c) mx = nan_max(mx, row[c]);  // a NaN score makes the row NaN
        m[r] = mx, sum[r] = 0;
        if (std::isnan(mx) || mx == inf || mx == -inf) {  // NaN (exp(inf - inf) too) or nothing visible
          RowArray<A>(row, nk).setZero();
          continue;
        }
        exp_shifted(row, nk, mx, row, ex);
        sum[r] = RowArray<A>(row, nk).sum();
      }
      const std::vector<Bad> bad = nonfinite(vb, nk, v_clean);
      o.topRows(n).noalias() = S * (bad.empty() ? vb : v_clean).topRows(nk);
      for (const Bad& e : bad)
        for (int64_t r = 0; r < n; ++r)
          if (std::isfinite(m[r]) && visible(p, b, i0 + r, k0 + e.row)) o(r, e.col) += s(r, e.row) * vb(e.row, e.col);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t i = i0 + r;
        T* oi = out + L.q(b, i, h);
        // A row with no visible key gets out = 0, lse = -inf; a NaN or infinite maximum, NaN in both.
        const bool poisoned = std::isnan(m[r]) || m[r] == inf;
        const A inv = poisoned ? nan : sum[r] == A(0) ? A(0) : A(1) / sum[r];
        for (int64_t x = 0; x < d; ++x) oi[x] = from_acc<T>(o(r, x) * inv);
        lse[L.row(b, h, i)] = poisoned ? nan : sum[r] == A(0) ? -inf : m[r] + std::log(sum[r]);
      }
    }
  }
}

template <class T>
void attention_backward(const AttentionParams& p, const T* q, const T* k, const T* v, const T* out,
                        const T* dout, const Acc<T>* lse, T* dq, T* dk, T* dv, const RopeOfQ* rope_q) {
  using A = Acc<T>;
  check_attention_params(p, "cpu::attention_backward");
  LOOM_CHECK(!rope_q || (rope_q->positions && rope_q->inv_freq && rope_q->rotary_dim > 0 &&
                         rope_q->rotary_dim % 2 == 0 && rope_q->rotary_dim <= p.head_dim),
             "cpu::attention_backward: q's rotation needs positions, inv_freq and an even rotary_dim <= head_dim ",
             p.head_dim, " (got ", rope_q ? rope_q->rotary_dim : 0, ")");
  const Layout L = layout_of(p);
  const int64_t d = p.head_dim, blocks = (p.seq + kBlock - 1) / kBlock, tasks = p.batch * p.kv_heads;
  const A inf = std::numeric_limits<A>::infinity(), nan = std::numeric_limits<A>::quiet_NaN();
  // One task per (batch, kv head): it owns dk, dv of that kv head and dq of the heads in its group,
  // so no two threads write the same output.
#pragma omp parallel if (p.batch * p.heads * p.seq * p.seq * d > 65536)
  {
    Mat<A> kb(p.seq, d), vb(p.seq, d), k_clean, qb(kBlock, d), q_clean, dob(kBlock, d), do_clean;
    Mat<A> s(kBlock, p.seq), dp(kBlock, p.seq), dcap(kBlock, p.seq), dqb(kBlock, d), dk_acc(p.seq, d), dv_acc(p.seq, d);
    EigenRow<A> ex(p.seq);
    std::vector<A> lse_r(kBlock);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / p.kv_heads, g = task % p.kv_heads;
      gather(k + L.kv(b, 0, g), p.kv_heads * d, p.seq, d, kb);
      gather(v + L.kv(b, 0, g), p.kv_heads * d, p.seq, d, vb);
      const std::vector<Bad> k_bad = nonfinite(kb, p.seq, k_clean);
      const Mat<A>& kc = k_bad.empty() ? kb : k_clean;
      dk_acc.setZero(), dv_acc.setZero();
      for (int64_t h = g * L.group; h < (g + 1) * L.group; ++h)
        for (int64_t blk = 0; blk < blocks; ++blk) {
          const int64_t i0 = blk * kBlock, n = std::min(kBlock, p.seq - i0);
          const int64_t k0 = first_key(p, i0), nk = i0 + n - k0;
          gather(q + L.q(b, i0, h), p.heads * d, n, d, qb);
          gather(dout + L.q(b, i0, h), p.heads * d, n, d, dob);
          auto S = s.topLeftCorner(n, nk), dP = dp.topLeftCorner(n, nk);
          S.noalias() = qb.topRows(n) * kb.middleRows(k0, nk).transpose();
          dP.noalias() = dob.topRows(n) * vb.middleRows(k0, nk).transpose();
          // S becomes P = exp(logit - lse) and dP becomes dS = P (dP - D) dcap, the gradient of the
          // scaled logit; both exactly 0 where masked and in rows whose lse is -inf (nothing visible).
          for (int64_t r = 0; r < n; ++r) {
            const int64_t i = i0 + r;
            const A li = lse[L.row(b, h, i)];
            const A D = dot(dout + L.q(b, i, h), out + L.q(b, i, h), d);  // D_i = dout_i . out_i
            lse_r[r] = li;
            A *pr = &s(r, 0), *dsr = &dp(r, 0), *cr = &dcap(r, 0);
            logits(pr, nk, p, cr);
            mask_row(pr, nk, p, b, i, k0);
            if (li == -inf) {
              std::fill(pr, pr + nk, A(0)), std::fill(dsr, dsr + nk, A(0));
              continue;
            }
            // A NaN lse (a NaN score in the forward) or logit gives NaN probabilities: NaN gradients.
            if (li != li)
              for (int64_t c = 0; c < nk; ++c) pr[c] = pr[c] == -inf ? A(0) : nan;
            else
              exp_shifted(pr, nk, li, pr, ex);
            for (int64_t c = 0; c < nk; ++c) dsr[c] = pr[c] == A(0) ? A(0) : pr[c] * (dsr[c] - D) * cr[c];
          }
          const auto Pm = s.topLeftCorner(n, nk), dSm = dp.topLeftCorner(n, nk);
          // dQ = scale dS K: K's non-finite elements are added where each query sees them.
          dqb.topRows(n).noalias() = dSm * kc.middleRows(k0, nk);
          for (const Bad& e : k_bad)
            for (int64_t r = 0; r < n; ++r)
              if (lse_r[r] != -inf && visible(p, b, i0 + r, e.row))  // (visible: k0 <= e.row <= i)
                dqb(r, e.col) += dp(r, e.row - k0) * kb(e.row, e.col);
          dqb.topRows(n) *= A(p.scale);
          if (rope_q) rotate_back(*rope_q, b * p.seq + i0, n, dqb);
          for (int64_t r = 0; r < n; ++r) {
            T* dqi = dq + L.q(b, i0 + r, h);
            for (int64_t x = 0; x < d; ++x) dqi[x] = from_acc<T>(dqb(r, x));
          }
          // dK += dS^T Q and dV += P^T dO: non-finite query or dout elements added where they see the key.
          const std::vector<Bad> q_bad = nonfinite(qb, n, q_clean), do_bad = nonfinite(dob, n, do_clean);
          dk_acc.middleRows(k0, nk).noalias() += dSm.transpose() * (q_bad.empty() ? qb : q_clean).topRows(n);
          dv_acc.middleRows(k0, nk).noalias() += Pm.transpose() * (do_bad.empty() ? dob : do_clean).topRows(n);
          for (const Bad& e : q_bad)
            for (int64_t c = 0; c < nk; ++c)
              if (lse_r[e.row] != -inf && visible(p, b, i0 + e.row, k0 + c))
                dk_acc(k0 + c, e.col) += dp(e.row, c) * qb(e.row, e.col);
          for (const Bad& e : do_bad)
            for (int64_t c = 0; c < nk; ++c)
              if (lse_r[e.row] != -inf && visible(p, b, i0 + e.row, k0 + c))
                dv_acc(k0 + c, e.col) += s(e.row, c) * dob(e.row, e.col);
        }
      for (int64_t j = 0; j < p.seq; ++j) {
        T* dkj = dk + L.kv(b, j, g);
        T* dvj = dv + L.kv(b, j, g);
        for (int64_t x = 0; x < d; ++x) {
          dkj[x] = from_acc<T>(A(p.scale) * dk_acc(j, x));
          dvj[x] = from_acc<T>(dv_acc(j, x));
        }
      }
    }
  }
}

#define LOOM_INST(T)                                                                                   \
  template void attention_forward<T>(const AttentionParams&, const T*, const T*, const T*, T*, Acc<T>*); \
  template void attention_backward<T>(const AttentionParams&, const T*, const T*, const T*, const T*,    \
                                      const T*, const Acc<T>*, T*, T*, T*, const RopeOfQ*);
LOOM_INST(float)
LOOM_INST(double)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cpu
