// ops:: mixture-of-experts routing, grouping by expert and combining (engine/ops.h). CPU kernels
// for now: on a CUDA tensor each says so by name.
#include <algorithm>

#include "engine/dispatch.h"
#include "engine/ops.h"
#include "kernels/moe.h"

namespace loom::ops {
using namespace detail;

namespace {
void cpu_only(const char* op, const Tensor& t) {
  LOOM_CHECK(t.device().is_cpu(), op, ": the mixture-of-experts kernels run on the CPU so far (got ", t.str(), ")");
}
}  // namespace

MoeRoute moe_route(const Tensor& logits_in, int64_t k, bool renorm) {
  const char* op = "moe_route";
  cpu_only(op, logits_in);
  LOOM_CHECK(logits_in.dim() == 2 && (logits_in.dtype() == DType::f32 || logits_in.dtype() == DType::f64), op,
             ": logits must be f32 or f64 [tokens, experts], got ", logits_in.str());
  const Tensor logits = logits_in.contiguous();
  const int64_t t = logits.size(0), e = logits.size(1);
  MoeRoute r{Tensor::empty({t, k}, DType::i32, logits.device()), Tensor::empty({t, k}, logits.dtype(), logits.device())};
  if (logits.dtype() == DType::f32)
    cpu::moe_route_forward(logits.data<float>(), r.ids.data<int32_t>(), r.weights.data<float>(), t, e, k, renorm);
  else
    cpu::moe_route_forward(logits.data<double>(), r.ids.data<int32_t>(), r.weights.data<double>(), t, e, k, renorm);
  return r;
}

Tensor moe_route_backward(const Tensor& logits_in, const MoeRoute& route, const Tensor& dweights_in, bool renorm) {
  const char* op = "moe_route_backward";
  cpu_only(op, logits_in);
  same_dtype(op, logits_in, dweights_in);
  same_shape(op, route.weights, dweights_in);
  const Tensor logits = logits_in.contiguous(), dw = dweights_in.contiguous();
  const int64_t t = logits.size(0), e = logits.size(1), k = route.ids.size(1);
  Tensor dl = Tensor::empty({t, e}, logits.dtype(), logits.device());
  if (logits.dtype() == DType::f32)
    cpu::moe_route_backward(logits.data<float>(), route.ids.data<int32_t>(), route.weights.data<float>(),
                            dw.data<float>(), dl.data<float>(), t, e, k, renorm);
  else
    cpu::moe_route_backward(logits.data<double>(), route.ids.data<int32_t>(), route.weights.data<double>(),
                            dw.data<double>(), dl.data<double>(), t, e, k, renorm);
  return dl;
}

namespace {
double aux_loss(const char* op, const Tensor& logits_in, const Tensor& ids_in, double dloss, Tensor* dlogits) {
  cpu_only(op, logits_in);
  expect_dtype(op, ids_in, DType::i32, "ids");
  const Tensor logits = logits_in.contiguous(), ids = ids_in.contiguous();
  LOOM_CHECK(logits.dim() == 2 && ids.dim() == 2 && ids.size(0) == logits.size(0), op, ": logits ", logits.str(),
             " and ids ", ids.str(), " do not fit");
  const int64_t n = logits.size(0), e = logits.size(1), k = ids.size(1);
  if (dlogits) *dlogits = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  if (logits.dtype() == DType::f64)
    return cpu::moe_aux_loss(logits.data<double>(), ids.data<int32_t>(), n, e, k, dloss,
                             dlogits ? dlogits->data<double>() : nullptr);
  expect_dtype(op, logits, DType::f32, "logits");
  return cpu::moe_aux_loss(logits.data<float>(), ids.data<int32_t>(), n, e, k, static_cast<float>(dloss),
                           dlogits ? dlogits->data<float>() : nullptr);
}
}  // namespace

double moe_aux_loss(const Tensor& logits, const Tensor& ids) { return aux_loss("moe_aux_loss", logits, ids, 0, nullptr); }

Tensor moe_aux_loss_backward(const Tensor& logits, const Tensor& ids, double dloss) {
  Tensor d;
  aux_loss("moe_aux_loss_backward", logits, ids, dloss, &d);
  return d;
}

MoeDispatch moe_dispatch(const Tensor& ids_in, int64_t experts) {
  const char* op = "moe_dispatch";
  expect_dtype(op, ids_in, DType::i32, "ids");
  LOOM_CHECK(ids_in.dim() == 2, op, ": ids must be [tokens, k], got ", ids_in.str());
  const std::vector<int32_t> ids = ids_in.to_ints();  // read to the host: the offsets drive the GEMMs
  const int64_t n = static_cast<int64_t>(ids.size());
  MoeDispatch d;
  d.offsets.assign(experts + 1, 0);
  for (int32_t e : ids) {
    LOOM_CHECK(e >= 0 && e < experts, op, ": expert ", e, " of ", experts);
    ++d.offsets[e + 1];
  }
  for (int64_t e = 0; e < experts; ++e) d.offsets[e + 1] += d.offsets[e];
  std::vector<int64_t> next(d.offsets.begin(), d.offsets.end() - 1);
  std::vector<int32_t> token_of_row(n), row_of(n);
  const int64_t k = ids_in.size(1);
  for (int64_t a = 0; a < n; ++a) {  // assignment a = t K + j, in token order: stable within an expert
    const int64_t r = next[ids[a]]++;
    token_of_row[r] = static_cast<int32_t>(a / k);
    row_of[a] = static_cast<int32_t>(r);
  }
  d.token_of_row = Tensor::from_ints(token_of_row, {n}).to(ids_in.device());
  d.row_of = Tensor::from_ints(row_of, {n}).to(ids_in.device());
  return d;
}

Tensor moe_combine(const Tensor& ys_in, const Tensor& row_of, const Tensor& weights_in) {
  const char* op = "moe_combine";
  cpu_only(op, ys_in);
  const Tensor ys = ys_in.contiguous(), w = weights_in.contiguous();
  LOOM_CHECK(ys.dim() == 2 && w.dim() == 2 && row_of.numel() == w.numel() && w.numel() == ys.size(0) &&
                 w.dtype() == acc_dtype(ys.dtype()),
             op, ": ys ", ys.str(), ", row_of ", row_of.str(), " and weights ", w.str(), " do not fit");
  const int64_t t = w.size(0), k = w.size(1), h = ys.size(1);
  Tensor y = Tensor::empty({t, h}, ys.dtype(), ys.device());
  dispatch_float(op, ys.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::moe_combine_forward(ys.data<T>(), row_of.data<int32_t>(), w.data<Acc<T>>(), y.data<T>(), t, k, h);
  });
  return y;
}

std::pair<Tensor, Tensor> moe_combine_backward(const Tensor& ys_in, const Tensor& row_of, const Tensor& weights_in,
                                               const Tensor& dy_in) {
  const char* op = "moe_combine_backward";
  cpu_only(op, ys_in);
  const Tensor ys = ys_in.contiguous(), w = weights_in.contiguous(), dy = dy_in.contiguous();
  const int64_t t = w.size(0), k = w.size(1), h = ys.size(1);
  LOOM_CHECK(dy.dim() == 2 && dy.size(0) == t && dy.size(1) == h && dy.dtype() == ys.dtype(), op, ": dy ", dy.str(),
             " does not fit ys ", ys.str());
  Tensor dys = Tensor::empty(ys.shape(), ys.dtype(), ys.device()), dw = Tensor::empty(w.shape(), w.dtype(), w.device());
  dispatch_float(op, ys.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::moe_combine_backward(ys.data<T>(), row_of.data<int32_t>(), w.data<Acc<T>>(), dy.data<T>(), dys.data<T>(),
                              dw.data<Acc<T>>(), t, k, h);
  });
  return {dys, dw};
}

}  // namespace loom::ops
