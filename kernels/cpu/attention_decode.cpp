// CPU reference for kernels/attention_decode.h.
#include "kernels/attention_decode.h"

#include <cmath>
#include <vector>

namespace loom::cpu {

template <class T>
void attention_decode(const DecodeParams& p, const T* q, const T* k, const T* v, T* out) {
  LOOM_CHECK(p.heads % p.kv_heads == 0 && p.length >= 1 && p.length <= p.capacity, "attention_decode: bad params (heads ",
             p.heads, ", kv_heads ", p.kv_heads, ", length ", p.length, ", capacity ", p.capacity, ")");
  using A = Acc<T>;
  const int64_t D = p.head_dim, group = p.heads / p.kv_heads;
  const int64_t first = p.window > 0 ? std::max<int64_t>(0, p.length - p.window) : 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      const T* qr = q + (b * p.heads + h) * D;
      const int64_t kvh = h / group;
      std::vector<A> s(p.length - first);
      A mx = -INFINITY;
      for (int64_t j = first; j < p.length; ++j) {
        const T* kr = k + ((b * p.capacity + j) * p.kv_heads + kvh) * D;
        A dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += to_acc(qr[d]) * to_acc(kr[d]);
        A x = dot * A(p.scale);
        if (p.softcap > 0.f) x = A(p.softcap) * std::tanh(x / A(p.softcap));
        s[j - first] = x;
        mx = nan_max(mx, x);
      }
      A sum = 0;
      for (A& x : s) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < D; ++d) {
        A acc = 0;
        for (int64_t j = first; j < p.length; ++j)
          acc += s[j - first] * to_acc(v[((b * p.capacity + j) * p.kv_heads + kvh) * D + d]);
        out[(b * p.heads + h) * D + d] = from_acc<T>(acc / sum);
      }
    }
}

template void attention_decode<float>(const DecodeParams&, const float*, const float*, const float*, float*);
template void attention_decode<double>(const DecodeParams&, const double*, const double*, const double*, double*);
template void attention_decode<bf16>(const DecodeParams&, const bf16*, const bf16*, const bf16*, bf16*);

}  // namespace loom::cpu
