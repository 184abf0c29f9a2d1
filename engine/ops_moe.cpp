// ops:: mixture-of-experts routing, grouping by expert, combining and the load-balancing loss
// (engine/ops.h), on the CPU reference kernels or the CUDA ones (kernels/moe.h). On CUDA nothing
// is read back but the dispatch's offsets, which the per-expert GEMMs need on the host.
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <string>

#include "engine/dispatch.h"
#include "engine/memory.h"
#include "engine/ops.h"
#include "kernels/moe.h"

namespace loom::ops {
using namespace detail;

namespace {
// The router's logits: [tokens, experts], f32, or f64 on the CPU (gradient checks).
Tensor router_logits(const char* op, const Tensor& logits) {
  LOOM_CHECK(logits.dim() == 2 && (logits.dtype() == DType::f32 || logits.dtype() == DType::f64), op,
             ": logits must be f32 or f64 [tokens, experts], got ", logits.str());
  LOOM_CHECK(logits.is_cpu() || logits.dtype() == DType::f32, op, ": logits on CUDA must be f32, got ", logits.str());
  return logits.contiguous();
}

Tensor choices(const char* op, const Tensor& logits, const Tensor& ids) {
  expect_dtype(op, ids, DType::i32, "ids");
  same_device(op, logits, ids);
  LOOM_CHECK(ids.dim() == 2 && ids.size(0) == logits.size(0), op, ": logits ", logits.str(), " and ids ", ids.str(),
             " do not fit");
  return ids.contiguous();
}

// A scratch buffer for a CUDA kernel, from the stream-ordered pool.
[[maybe_unused]] Tensor workspace(size_t bytes, Device device) {
  return Tensor::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, DType::u8, device);
}
}  // namespace

MoeRoute moe_route(const Tensor& logits_in, int64_t k, bool renorm) {
  const char* op = "moe_route";
  const Tensor logits = router_logits(op, logits_in);
  const int64_t t = logits.size(0), e = logits.size(1);
  LOOM_CHECK(k >= 1 && k <= e, op, ": top ", k, " of ", e, " experts");
  MoeRoute r{Tensor::empty({t, k}, DType::i32, logits.device()), Tensor::empty({t, k}, logits.dtype(), logits.device())};
  if (logits.is_cuda())
    LOOM_ON_CUDA(op, float, cuda::moe_route_forward(logits.data<float>(), r.ids.data<int32_t>(),
                                                    r.weights.data<float>(), t, e, k, renorm, stream_of(logits)));
  else if (logits.dtype() == DType::f32)
    cpu::moe_route_forward(logits.data<float>(), r.ids.data<int32_t>(), r.weights.data<float>(), t, e, k, renorm);
  else
    cpu::moe_route_forward(logits.data<double>(), r.ids.data<int32_t>(), r.weights.data<double>(), t, e, k, renorm);
  return r;
}

Tensor moe_route_backward(const Tensor& logits_in, const MoeRoute& route, const Tensor& dweights_in, bool renorm) {
  const char* op = "moe_route_backward";
  const Tensor logits = router_logits(op, logits_in);
  same_dtype(op, logits_in, dweights_in);
  same_shape(op, route.weights, dweights_in);
  same_device(op, logits_in, dweights_in);
  const Tensor ids = choices(op, logits, route.ids), w = route.weights.contiguous(), dw = dweights_in.contiguous();
  same_dtype(op, logits, w);
  LOOM_CHECK(w.shape() == ids.shape(), op, ": weights ", w.str(), " and ids ", ids.str(), " differ in shape");
  const int64_t t = logits.size(0), e = logits.size(1), k = ids.size(1);
  Tensor dl = Tensor::empty({t, e}, logits.dtype(), logits.device());
  if (logits.is_cuda())
    LOOM_ON_CUDA(op, float, cuda::moe_route_backward(logits.data<float>(), ids.data<int32_t>(), w.data<float>(),
                                                     dw.data<float>(), dl.data<float>(), t, e, k, renorm,
                                                     stream_of(logits)));
  else if (logits.dtype() == DType::f32)
    cpu::moe_route_backward(logits.data<float>(), ids.data<int32_t>(), w.data<float>(), dw.data<float>(),
                            dl.data<float>(), t, e, k, renorm);
  else
    cpu::moe_route_backward(logits.data<double>(), ids.data<int32_t>(), w.data<double>(), dw.data<double>(),
                            dl.data<double>(), t, e, k, renorm);
  return dl;
}

namespace {
// The loss (a scalar of the logits' dtype on their device) or, with dloss, dlogits.
Tensor aux_loss(const char* op, const Tensor& logits_in, const Tensor& ids_in, const Tensor* dloss) {
  const Tensor logits = router_logits(op, logits_in), ids = choices(op, logits, ids_in);
  const int64_t n = logits.size(0), e = logits.size(1), k = ids.size(1);
  LOOM_CHECK(n >= 1, op, ": no tokens in ", logits.str());
  Tensor out = dloss ? Tensor::empty(logits.shape(), logits.dtype(), logits.device())
                     : Tensor::empty({}, logits.dtype(), logits.device());
  if (logits.is_cuda()) {
    LOOM_ON_CUDA(op, float, {
      Tensor ws = workspace(cuda::moe_aux_loss_workspace_bytes(n, e), logits.device());
      if (dloss)
        cuda::moe_aux_loss_backward(logits.data<float>(), ids.data<int32_t>(), n, e, k, dloss->data<float>(),
                                    out.data<float>(), ws.data_ptr(), stream_of(logits));
      else
        cuda::moe_aux_loss(logits.data<float>(), ids.data<int32_t>(), n, e, k, out.data<float>(), ws.data_ptr(),
                           stream_of(logits));
    });
    return out;
  }
  auto run = [&](auto tag) {
    using F = decltype(tag);
    const F g = dloss ? dloss->data<F>()[0] : F(0);
    const F loss = cpu::moe_aux_loss(logits.data<F>(), ids.data<int32_t>(), n, e, k, g, dloss ? out.data<F>() : nullptr);
    if (!dloss) out.data<F>()[0] = loss;
  };
  if (logits.dtype() == DType::f64)
    run(double{});
  else
    run(float{});
  return out;
}
}  // namespace

Tensor moe_aux_loss(const Tensor& logits, const Tensor& ids) { return aux_loss("moe_aux_loss", logits, ids, nullptr); }

Tensor moe_aux_loss_backward(const Tensor& logits, const Tensor& ids, const Tensor& dloss_in) {
  const char* op = "moe_aux_loss_backward";
  same_device(op, logits, dloss_in);
  LOOM_CHECK(dloss_in.numel() == 1, op, ": dloss must be a scalar, got ", dloss_in.str());
  const Tensor dloss = dloss_in.to(logits.dtype()).contiguous();  // a device cast: nothing is read back
  return aux_loss(op, logits, ids, &dloss);
}

namespace {

// 0, 1, ..., n - 1 as i32 on `device`, kept per size and device (the same sizes come back every
// layer and step; on CUDA each new one is an upload).
Tensor row_ids(int64_t n, Device device) {
  static std::mutex mu;
  static auto* cache = new std::map<std::pair<int64_t, std::string>, Tensor>();  // never destroyed: outlives callers
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(n, device.str());
  if (auto it = cache->find(key); it != cache->end()) return it->second;
  if (cache->size() >= 16) cache->clear();
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  Tensor t = Tensor::from_ints(v, {n});
  if (!device.is_cpu()) {
    const LongLivedPoolScope long_lived;  // kept for good: not among a step's activations
    t = t.to(device);
  }
  cache->emplace(key, t);
  return t;
}

}  // namespace

MoeDispatch moe_dispatch(const Tensor& ids_in, int64_t experts) {
  const char* op = "moe_dispatch";
  expect_dtype(op, ids_in, DType::i32, "ids");
  LOOM_CHECK(ids_in.dim() == 2 && ids_in.size(1) >= 1, op, ": ids must be [tokens, k], got ", ids_in.str());
  LOOM_CHECK(experts >= 1 && ids_in.numel() <= 0x7fffffffLL, op, ": ", experts, " experts for ", ids_in.str());
  const Tensor ids_t = ids_in.contiguous();
  const int64_t n = ids_t.numel(), k = ids_t.size(1);
  MoeDispatch d;
  if (ids_t.is_cuda()) {
#if LOOM_WITH_CUDA
    d.token_of_row = Tensor::empty({n}, DType::i32, ids_t.device());
    d.row_of = Tensor::empty({n}, DType::i32, ids_t.device());
    d.device_offsets = Tensor::empty({experts + 1}, DType::i64, ids_t.device());
    Tensor ws = workspace(cuda::moe_dispatch_workspace_bytes(n, experts), ids_t.device());
    cuda::moe_dispatch(ids_t.data<int32_t>(), n, k, experts, d.token_of_row.data<int32_t>(), d.row_of.data<int32_t>(),
                       d.device_offsets.data<int64_t>(), ws.data_ptr(), stream_of(ids_t));
    const Tensor host = d.device_offsets.to(Device::cpu());  // the one read-back: E + 1 integers
    const int64_t* o = host.data<int64_t>();
    d.offsets.assign(o, o + experts + 1);
    LOOM_CHECK(d.offsets[experts] == n, op, ": ", n - d.offsets[experts], " of the ", n,
               " choices name an expert outside [0, ", experts, ")");
    d.rows = row_ids(n, ids_t.device());
    return d;
#else
    LOOM_CHECK(false, op, ": Loom was built without CUDA (LOOM_CUDA=OFF)");
#endif
  }
  const int32_t* ids = ids_t.data<int32_t>();
  d.offsets.assign(experts + 1, 0);
  for (int64_t a = 0; a < n; ++a) {
    LOOM_CHECK(ids[a] >= 0 && ids[a] < experts, op, ": expert ", ids[a], " of ", experts);
    ++d.offsets[ids[a] + 1];
  }
  for (int64_t e = 0; e < experts; ++e) d.offsets[e + 1] += d.offsets[e];
  std::vector<int64_t> next(d.offsets.begin(), d.offsets.end() - 1);
  d.token_of_row = Tensor::empty({n}, DType::i32);
  d.row_of = Tensor::empty({n}, DType::i32);
  int32_t *token_of_row = d.token_of_row.data<int32_t>(), *row_of = d.row_of.data<int32_t>();
  for (int64_t a = 0; a < n; ++a) {  // assignment a = t K + j, in token order: stable within an expert
    const int64_t r = next[ids[a]]++;
    token_of_row[r] = static_cast<int32_t>(a / k);
    row_of[a] = static_cast<int32_t>(r);
  }
  d.device_offsets = Tensor::empty({experts + 1}, DType::i64);
  std::memcpy(d.device_offsets.data_ptr(), d.offsets.data(), d.offsets.size() * sizeof(int64_t));
  d.rows = row_ids(n, Device::cpu());
  return d;
}

namespace {
void check_combine(const char* op, const Tensor& ys, const Tensor& row_of, const Tensor& w) {
  same_device(op, ys, row_of);
  same_device(op, ys, w);
  expect_dtype(op, row_of, DType::i32, "row_of");
  LOOM_CHECK(ys.dim() == 2 && w.dim() == 2 && row_of.numel() == w.numel() && w.numel() == ys.size(0) &&
                 w.dtype() == acc_dtype(ys.dtype()),
             op, ": ys ", ys.str(), ", row_of ", row_of.str(), " and weights ", w.str(), " do not fit");
}
}  // namespace

Tensor moe_combine(const Tensor& ys_in, const Tensor& row_of_in, const Tensor& weights_in) {
  const char* op = "moe_combine";
  check_combine(op, ys_in, row_of_in, weights_in);
  const Tensor ys = ys_in.contiguous(), row_of = row_of_in.contiguous(), w = weights_in.contiguous();
  const int64_t t = w.size(0), k = w.size(1), h = ys.size(1);
  Tensor y = Tensor::empty({t, h}, ys.dtype(), ys.device());
  dispatch_float(op, ys.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (ys.is_cuda())
      LOOM_ON_CUDA(op, T, cuda::moe_combine_forward(ys.data<T>(), row_of.data<int32_t>(), w.data<float>(), y.data<T>(),
                                                    t, k, h, stream_of(ys)));
    else
      cpu::moe_combine_forward(ys.data<T>(), row_of.data<int32_t>(), w.data<Acc<T>>(), y.data<T>(), t, k, h);
  });
  return y;
}

std::pair<Tensor, Tensor> moe_combine_backward(const Tensor& ys_in, const Tensor& row_of_in, const Tensor& weights_in,
                                               const Tensor& dy_in) {
  const char* op = "moe_combine_backward";
  check_combine(op, ys_in, row_of_in, weights_in);
  same_device(op, ys_in, dy_in);
  const Tensor ys = ys_in.contiguous(), row_of = row_of_in.contiguous(), w = weights_in.contiguous(),
               dy = dy_in.contiguous();
  const int64_t t = w.size(0), k = w.size(1), h = ys.size(1);
  LOOM_CHECK(dy.dim() == 2 && dy.size(0) == t && dy.size(1) == h && dy.dtype() == ys.dtype(), op, ": dy ", dy.str(),
             " does not fit ys ", ys.str());
  Tensor dys = Tensor::empty(ys.shape(), ys.dtype(), ys.device()), dw = Tensor::empty(w.shape(), w.dtype(), w.device());
  dispatch_float(op, ys.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (ys.is_cuda())
      LOOM_ON_CUDA(op, T, cuda::moe_combine_backward(ys.data<T>(), row_of.data<int32_t>(), w.data<float>(),
                                                     dy.data<T>(), dys.data<T>(), dw.data<float>(), t, k, h,
                                                     stream_of(ys)));
    else
      cpu::moe_combine_backward(ys.data<T>(), row_of.data<int32_t>(), w.data<Acc<T>>(), dy.data<T>(), dys.data<T>(),
                                dw.data<Acc<T>>(), t, k, h);
  });
  return {dys, dw};
}

}  // namespace loom::ops
