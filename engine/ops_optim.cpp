// ops:: the AdamW step and Philox random fills.
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "kernels/adamw.h"
#include "kernels/dropout.h"
#include "kernels/philox.h"

namespace loom::ops {
using namespace detail;

namespace {
// adamw_step's checks; the bf16 copy's data, or null.
bf16* check_adamw(const char* op, const Tensor& param, const Tensor& grad_in, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, Tensor* param_bf16) {
  for (const Tensor* t : {&exp_avg, &exp_avg_sq}) {
    same_device(op, param, *t);
    expect_dtype(op, *t, DType::f32, "optimizer state");
    expect_contiguous(op, *t, "optimizer state");
    LOOM_CHECK(t->numel() == param.numel(), op, ": state ", t->str(), " does not match param ", param.str());
  }
  expect_dtype(op, param, DType::f32, "param");
  expect_contiguous(op, param, "param");
  same_device(op, param, grad_in);
  LOOM_CHECK(grad_in.numel() == param.numel(), op, ": grad ", grad_in.str(), " does not match param ", param.str());
  bf16* copy = nullptr;
  if (param_bf16) {
    same_device(op, param, *param_bf16);
    expect_dtype(op, *param_bf16, DType::bf16, "param copy");
    expect_contiguous(op, *param_bf16, "param copy");
    LOOM_CHECK(param_bf16->numel() == param.numel(), op, ": bf16 copy ", param_bf16->str(), " vs ", param.str());
    copy = param_bf16->data<bf16>();
  }
  return copy;
}
}  // namespace

void adamw_step(Tensor& param, const Tensor& grad_in, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWParams& p,
                Tensor* param_bf16) {
  const char* op = "adamw_step";
  bf16* copy = check_adamw(op, param, grad_in, exp_avg, exp_avg_sq, param_bf16);
  Tensor grad = grad_in.contiguous();
  auto run = [&](auto tag) {
    using G = decltype(tag);
    if (param.is_cuda()) {
#if LOOM_WITH_CUDA
      cuda::adamw_step(param.data<float>(), grad.data<G>(), exp_avg.data<float>(), exp_avg_sq.data<float>(),
                       param.numel(), p, copy, stream_of(param));
#else
      LOOM_CHECK(false, op, ": Loom was built without CUDA (LOOM_CUDA=OFF)");
#endif
    } else {
      cpu::adamw_step(param.data<float>(), grad.data<G>(), exp_avg.data<float>(), exp_avg_sq.data<float>(),
                      param.numel(), p, copy);
    }
  };
  if (grad.dtype() == DType::f32) run(float{});
  else if (grad.dtype() == DType::bf16) run(bf16{});
  else LOOM_CHECK(false, op, ": grad must be f32 or bf16, got ", grad.str());
}

void adamw_step_many(const std::vector<AdamWItem>& items) {
  const char* op = "adamw_step_many";
  bool batch = !items.empty() && items[0].param->is_cuda();
  for (const AdamWItem& it : items) {
    const AdamWItem& a = items[0];
    batch = batch && it.param->device() == a.param->device() && it.grad->dtype() == a.grad->dtype() &&
            it.grad->is_contiguous() && it.p->beta2 == a.p->beta2 && it.p->eps == a.p->eps &&
            it.p->grad_scale == a.p->grad_scale && it.p->grad_scale_at == a.p->grad_scale_at;
  }
  if (!batch) {
    for (const AdamWItem& it : items) adamw_step(*it.param, *it.grad, *it.exp_avg, *it.exp_avg_sq, *it.p, it.param_bf16);
    return;
  }
#if LOOM_WITH_CUDA
  std::vector<cuda::AdamWSpan> spans;
  spans.reserve(items.size());
  for (const AdamWItem& it : items) {
    LOOM_CHECK(it.p->step >= 1, op, ": step is 1-based and already incremented, got ", it.p->step);
    bf16* copy = check_adamw(op, *it.param, *it.grad, *it.exp_avg, *it.exp_avg_sq, it.param_bf16);
    spans.push_back(cuda::AdamWSpan{it.param->data<float>(), it.grad->data_ptr(), it.exp_avg->data<float>(),
                                    it.exp_avg_sq->data<float>(), copy, it.param->numel(), adamw_scalars(*it.p)});
  }
  const AdamWParams& p = *items[0].p;
  const Stream s = stream_of(*items[0].param);
  const auto count = static_cast<int64_t>(spans.size());
  if (items[0].grad->dtype() == DType::f32)
    cuda::adamw_step_many<float>(spans.data(), count, p.beta2, p.eps, p.grad_scale, p.grad_scale_at, s);
  else if (items[0].grad->dtype() == DType::bf16)
    cuda::adamw_step_many<bf16>(spans.data(), count, p.beta2, p.eps, p.grad_scale, p.grad_scale_at, s);
  else
    LOOM_CHECK(false, op, ": grad must be f32 or bf16, got ", items[0].grad->str());
#else
  LOOM_CHECK(false, op, ": Loom was built without CUDA (LOOM_CUDA=OFF)");
#endif
}

namespace {
template <bool kNormal>
void random_fill(const char* op, Tensor& t, uint64_t seed, uint64_t offset, float a, float b) {
  expect_contiguous(op, t, "tensor");
  dispatch_float(op, t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (t.is_cuda()) {
      LOOM_ON_CUDA(op, T, {
        if (kNormal) cuda::normal_fill(t.data<T>(), t.numel(), seed, offset, a, b, stream_of(t));
        else cuda::uniform_fill(t.data<T>(), t.numel(), seed, offset, a, b, stream_of(t));
      });
    } else if (kNormal) {
      cpu::normal_fill(t.data<T>(), t.numel(), seed, offset, a, b);
    } else {
      cpu::uniform_fill(t.data<T>(), t.numel(), seed, offset, a, b);
    }
  });
}
}  // namespace

Tensor dropout(const Tensor& x_in, float p, uint64_t seed, uint64_t offset) {
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float("dropout", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (x.is_cuda())
      LOOM_ON_CUDA("dropout", T, cuda::dropout(x.data<T>(), out.data<T>(), x.numel(), p, seed, offset, stream_of(x)));
    else
      cpu::dropout(x.data<T>(), out.data<T>(), x.numel(), p, seed, offset);
  });
  return out;
}

void uniform_(Tensor& t, uint64_t seed, uint64_t offset, float lo, float hi) {
  random_fill<false>("uniform_", t, seed, offset, lo, hi);
}
void normal_(Tensor& t, uint64_t seed, uint64_t offset, float mean, float std) {
  random_fill<true>("normal_", t, seed, offset, mean, std);
}

}  // namespace loom::ops
