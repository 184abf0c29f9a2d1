// CPU reference of kernels/moe.h.
#include "kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace loom::cpu {

template <class F>
void moe_route_forward(const F* logits, int32_t* ids, F* weights, int64_t tokens, int64_t experts, int64_t k,
                       bool renorm) {
  LOOM_CHECK(k >= 1 && k <= experts, "moe_route: top ", k, " of ", experts, " experts");
  std::vector<F> p(experts);
  std::vector<int32_t> order(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const F* l = logits + t * experts;
    const F mx = *std::max_element(l, l + experts);
    F z = 0;
    for (int64_t e = 0; e < experts; ++e) z += p[e] = std::exp(l[e] - mx);
    for (int64_t e = 0; e < experts; ++e) p[e] /= z;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    F s = 0;
    for (int64_t j = 0; j < k; ++j) s += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      ids[t * k + j] = order[j];
      weights[t * k + j] = renorm ? p[order[j]] / s : p[order[j]];
    }
  }
}

template <class F>
void moe_route_backward(const F* logits, const int32_t* ids, const F* weights, const F* dweights, F* dlogits,
                        int64_t tokens, int64_t experts, int64_t k, bool renorm) {
  std::vector<F> p(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t* id = ids + t * k;
    const F *w = weights + t * k, *dw = dweights + t * k;
    F* dl = dlogits + t * experts;
    std::fill(dl, dl + experts, F(0));
    if (renorm) {  // w = softmax over the chosen logits: dl_e = w_e (dw_e - sum_j dw_j w_j), chosen e only
      F dot = 0;
      for (int64_t j = 0; j < k; ++j) dot += dw[j] * w[j];
      for (int64_t j = 0; j < k; ++j) dl[id[j]] += w[j] * (dw[j] - dot);
      continue;
    }
    // w_j = p_{id_j} of the softmax over every expert: dl_e = p_e (dw at e - sum_j dw_j p_{id_j}).
    const F* l = logits + t * experts;
    const F mx = *std::max_element(l, l + experts);
    F z = 0;
    for (int64_t e = 0; e < experts; ++e) z += p[e] = std::exp(l[e] - mx);
    F dot = 0;
    for (int64_t j = 0; j < k; ++j) dot += dw[j] * w[j];
    for (int64_t e = 0; e < experts; ++e) dl[e] = -(p[e] / z) * dot;
    for (int64_t j = 0; j < k; ++j) dl[id[j]] += w[j] * dw[j];
  }
}

template <class F>
F moe_aux_loss(const F* logits, const int32_t* ids, int64_t tokens, int64_t experts, int64_t k, F dloss, F* dlogits) {
  std::vector<F> count(experts, 0), mean_p(experts, 0), p(static_cast<size_t>(tokens * experts));
  for (int64_t a = 0; a < tokens * k; ++a) count[ids[a]] += 1;
  for (int64_t t = 0; t < tokens; ++t) {
    const F* l = logits + t * experts;
    F* pt = p.data() + t * experts;
    const F mx = *std::max_element(l, l + experts);
    F z = 0;
    for (int64_t e = 0; e < experts; ++e) z += pt[e] = std::exp(l[e] - mx);
    for (int64_t e = 0; e < experts; ++e) mean_p[e] += (pt[e] /= z) / static_cast<F>(tokens);
  }
  F loss = 0;
  for (int64_t e = 0; e < experts; ++e) loss += count[e] / static_cast<F>(tokens) * mean_p[e];
  loss *= static_cast<F>(experts);
  if (dlogits) {  // d loss / d p_te = E c_e / N^2, then through each token's softmax
    for (int64_t t = 0; t < tokens; ++t) {
      const F* pt = p.data() + t * experts;
      F* dl = dlogits + t * experts;
      F dot = 0;
      for (int64_t e = 0; e < experts; ++e) {
        dl[e] = dloss * static_cast<F>(experts) * count[e] / (static_cast<F>(tokens) * static_cast<F>(tokens));
        dot += dl[e] * pt[e];
      }
      for (int64_t e = 0; e < experts; ++e) dl[e] = pt[e] * (dl[e] - dot);
    }
  }
  return loss;
}
template float moe_aux_loss<float>(const float*, const int32_t*, int64_t, int64_t, int64_t, float, float*);
template double moe_aux_loss<double>(const double*, const int32_t*, int64_t, int64_t, int64_t, double, double*);

template <class T>
void moe_combine_forward(const T* ys, const int32_t* row_of, const Acc<T>* w, T* y, int64_t tokens, int64_t k, int64_t h) {
  std::vector<Acc<T>> acc(h);
  for (int64_t t = 0; t < tokens; ++t) {
    std::fill(acc.begin(), acc.end(), Acc<T>(0));
    for (int64_t j = 0; j < k; ++j) {
      const T* row = ys + static_cast<int64_t>(row_of[t * k + j]) * h;
      const Acc<T> wj = w[t * k + j];
      for (int64_t c = 0; c < h; ++c) acc[c] += wj * to_acc(row[c]);
    }
    for (int64_t c = 0; c < h; ++c) y[t * h + c] = from_acc<T>(acc[c]);
  }
}

template <class T>
void moe_combine_backward(const T* ys, const int32_t* row_of, const Acc<T>* w, const T* dy, T* dys, Acc<T>* dw,
                          int64_t tokens, int64_t k, int64_t h) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = row_of[t * k + j];
      const Acc<T> wj = w[t * k + j];
      Acc<T> dot = 0;
      for (int64_t c = 0; c < h; ++c) {
        const Acc<T> g = to_acc(dy[t * h + c]);
        dot += to_acc(ys[r * h + c]) * g;
        dys[r * h + c] = from_acc<T>(wj * g);
      }
      dw[t * k + j] = dot;
    }
}

template void moe_route_forward<float>(const float*, int32_t*, float*, int64_t, int64_t, int64_t, bool);
template void moe_route_forward<double>(const double*, int32_t*, double*, int64_t, int64_t, int64_t, bool);
template void moe_route_backward<float>(const float*, const int32_t*, const float*, const float*, float*, int64_t,
                                        int64_t, int64_t, bool);
template void moe_route_backward<double>(const double*, const int32_t*, const double*, const double*, double*, int64_t,
                                         int64_t, int64_t, bool);
#define LOOM_MOE(T)                                                                                               \
  template void moe_combine_forward<T>(const T*, const int32_t*, const Acc<T>*, T*, int64_t, int64_t, int64_t); \
  template void moe_combine_backward<T>(const T*, const int32_t*, const Acc<T>*, const T*, T*, Acc<T>*, int64_t, \
                                        int64_t, int64_t);
LOOM_MOE(float)
LOOM_MOE(double)
LOOM_MOE(bf16)
#undef LOOM_MOE

}  // namespace loom::cpu
