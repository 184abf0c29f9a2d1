// CPU reference for kernels/attention.h: one query row at a time, scores materialized per row,
// softmax in Acc<T>; backward recomputes the probabilities from the saved log-sum-exp.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace loom::cpu {
namespace {

// Index helpers for the [batch, seq, heads, head_dim] / [batch, heads, seq] layouts.
struct Layout {
  int64_t seq, heads, kv_heads, d, group;
  int64_t q(int64_t b, int64_t i, int64_t h) const { return ((b * seq + i) * heads + h) * d; }
  int64_t kv(int64_t b, int64_t j, int64_t g) const { return ((b * seq + j) * kv_heads + g) * d; }
  int64_t row(int64_t b, int64_t h, int64_t i) const { return (b * heads + h) * seq + i; }
};

Layout layout_of(const AttentionParams& p) {
  return {p.seq, p.heads, p.kv_heads, p.head_dim, p.heads / p.kv_heads};
}

// First key query i may see; the last is i itself.
int64_t first_key(const AttentionParams& p, int64_t i) {
  return p.window > 0 ? std::max<int64_t>(0, i - p.window + 1) : 0;
}

bool same_segment(const AttentionParams& p, int64_t b, int64_t i, int64_t j) {
  return p.segment_ids == nullptr || p.segment_ids[b * p.seq + i] == p.segment_ids[b * p.seq + j];
}

// 16 independent partial sums (one AVX-512 register of f32, two of f64) added in a fixed order at
// the end: the compiler vectorises the lanes without reassociating anything, so the result is the
// same on every ISA; a single running sum would be a serial chain of scalar adds.
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

// Scaled, optionally capped logit; *dcap receives d(capped)/d(scaled) (1 without a cap).
template <class A>
A logit(A raw_dot, const AttentionParams& p, A* dcap) {
  const A s = A(p.scale) * raw_dot;
  if (p.softcap > 0.f) {
    const A t = std::tanh(s / A(p.softcap));
    *dcap = A(1) - t * t;
    return A(p.softcap) * t;
  }
  *dcap = A(1);
  return s;
}

}  // namespace

template <class T>
void attention_forward(const AttentionParams& p, const T* q, const T* k, const T* v, T* out, Acc<T>* lse) {
  using A = Acc<T>;
  check_attention_params(p, "cpu::attention_forward");
  const Layout L = layout_of(p);
  const int64_t rows = p.batch * p.heads * p.seq, d = p.head_dim;
  // Threads only when there is work for them: a parallel region per tiny call costs more than the
  // call, and far more on a loaded machine where every region waits for all of its threads.
#pragma omp parallel if (rows * p.seq * d > 65536)
  {
    std::vector<A> score(p.seq), acc(d);
#pragma omp for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r % p.seq, h = (r / p.seq) % p.heads, b = r / (p.seq * p.heads);
      const int64_t g = h / L.group, lo = first_key(p, i);
      const T* qi = q + L.q(b, i, h);
      A m = -std::numeric_limits<A>::infinity();
      for (int64_t j = lo; j <= i; ++j) {
        A unused;
        score[j] = same_segment(p, b, i, j) ? logit(dot(qi, k + L.kv(b, j, g), d), p, &unused)
                                            : -std::numeric_limits<A>::infinity();
        m = nan_max(m, score[j]);  // a NaN score makes m, and so the row, NaN
      }
      std::fill(acc.begin(), acc.end(), A(0));
      A sum = 0;
      if (m != -std::numeric_limits<A>::infinity()) {
        for (int64_t j = lo; j <= i; ++j) {
          if (score[j] == -std::numeric_limits<A>::infinity()) continue;
          const A w = std::exp(score[j] - m);
          sum += w;
          const T* vj = v + L.kv(b, j, g);
          for (int64_t x = 0; x < d; ++x) acc[x] += w * to_acc(vj[x]);
        }
      }
      // A row with no visible key (impossible with causality) gets out = 0, lse = -inf; a NaN sum
      // (a NaN score or value, an infinite score) stays NaN in both.
      const A inv = sum == A(0) ? A(0) : A(1) / sum;
      T* oi = out + L.q(b, i, h);
      for (int64_t x = 0; x < d; ++x) oi[x] = from_acc<T>(acc[x] * inv);
      lse[L.row(b, h, i)] = sum == A(0) ? -std::numeric_limits<A>::infinity() : m + std::log(sum);
    }
  }
}

template <class T>
void attention_backward(const AttentionParams& p, const T* q, const T* k, const T* v, const T* out,
                        const T* dout, const Acc<T>* lse, T* dq, T* dk, T* dv) {
  using A = Acc<T>;
  check_attention_params(p, "cpu::attention_backward");
  const Layout L = layout_of(p);
  const int64_t d = p.head_dim, tasks = p.batch * p.kv_heads;
  // One task per (batch, kv head): it owns dk, dv of that kv head and dq of the heads in its group,
  // so no two threads write the same output.
#pragma omp parallel if (p.batch * p.heads * p.seq * p.seq * d > 65536)
  {
    std::vector<A> dk_acc(p.seq * d), dv_acc(p.seq * d), dq_acc(d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / p.kv_heads, g = task % p.kv_heads;
      std::fill(dk_acc.begin(), dk_acc.end(), A(0));
      std::fill(dv_acc.begin(), dv_acc.end(), A(0));
      for (int64_t h = g * L.group; h < (g + 1) * L.group; ++h) {
        for (int64_t i = 0; i < p.seq; ++i) {
          const T* qi = q + L.q(b, i, h);
          const T* doi = dout + L.q(b, i, h);
          const A lse_i = lse[L.row(b, h, i)];
          const A D = dot(doi, out + L.q(b, i, h), d);  // D_i = dout_i . out_i
          std::fill(dq_acc.begin(), dq_acc.end(), A(0));
          if (lse_i != -std::numeric_limits<A>::infinity()) {  // a NaN lse gives NaN gradients
            for (int64_t j = first_key(p, i); j <= i; ++j) {
              if (!same_segment(p, b, i, j)) continue;
              const T* kj = k + L.kv(b, j, g);
              const T* vj = v + L.kv(b, j, g);
              A dcap;
              const A prob = std::exp(logit(dot(qi, kj, d), p, &dcap) - lse_i);
              const A ds = prob * (dot(doi, vj, d) - D) * dcap;  // d loss / d (scaled logit)
              A* dkj = dk_acc.data() + j * d;
              A* dvj = dv_acc.data() + j * d;
              for (int64_t x = 0; x < d; ++x) {
                dq_acc[x] += ds * to_acc(kj[x]);
                dkj[x] += ds * to_acc(qi[x]);
                dvj[x] += prob * to_acc(doi[x]);
              }
            }
          }
          T* dqi = dq + L.q(b, i, h);
          for (int64_t x = 0; x < d; ++x) dqi[x] = from_acc<T>(A(p.scale) * dq_acc[x]);
        }
      }
      for (int64_t j = 0; j < p.seq; ++j) {
        T* dkj = dk + L.kv(b, j, g);
        T* dvj = dv + L.kv(b, j, g);
        for (int64_t x = 0; x < d; ++x) {
          dkj[x] = from_acc<T>(A(p.scale) * dk_acc[j * d + x]);
          dvj[x] = from_acc<T>(dv_acc[j * d + x]);
        }
      }
    }
  }
}

#define LOOM_INST(T)                                                                                   \
  template void attention_forward<T>(const AttentionParams&, const T*, const T*, const T*, T*, Acc<T>*); \
  template void attention_backward<T>(const AttentionParams&, const T*, const T*, const T*, const T*,    \
                                      const T*, const Acc<T>*, T*, T*, T*);
LOOM_INST(float)
LOOM_INST(double)
LOOM_INST(bf16)
#undef LOOM_INST

}  // namespace loom::cpu
