// ops:: elementwise functions and reductions.
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "kernels/elementwise.h"
#include "kernels/grad_norm.h"

#include <cmath>
#include <cstring>

#if LOOM_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#endif

namespace loom::ops {
using namespace detail;

DType acc_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

namespace {
void check_binary(const char* op, const Tensor& a, const Tensor& b) {
  same_device(op, a, b);
  same_dtype(op, a, b);
  same_shape(op, a, b);
}
}  // namespace

Tensor axpby(const Tensor& a_in, const Tensor& b_in, float alpha, float beta) {
  check_binary("axpby", a_in, b_in);
  Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  dispatch_float("axpby", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (a.is_cuda())
      LOOM_ON_CUDA("axpby", T, cuda::axpby(a.data<T>(), b.data<T>(), out.data<T>(), a.numel(), alpha, beta, stream_of(a)));
    else
      cpu::axpby(a.data<T>(), b.data<T>(), out.data<T>(), a.numel(), alpha, beta);
  });
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) { return axpby(a, b, 1.f, 1.f); }
Tensor sub(const Tensor& a, const Tensor& b) { return axpby(a, b, 1.f, -1.f); }

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
  check_binary("mul", a_in, b_in);
  Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  dispatch_float("mul", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (a.is_cuda())
      LOOM_ON_CUDA("mul", T, cuda::mul(a.data<T>(), b.data<T>(), out.data<T>(), a.numel(), stream_of(a)));
    else
      cpu::mul(a.data<T>(), b.data<T>(), out.data<T>(), a.numel());
  });
  return out;
}

Tensor scale(const Tensor& a_in, float s) {
  Tensor a = a_in.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  dispatch_float("scale", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (a.is_cuda())
      LOOM_ON_CUDA("scale", T, cuda::scale(a.data<T>(), out.data<T>(), a.numel(), s, stream_of(a)));
    else
      cpu::scale(a.data<T>(), out.data<T>(), a.numel(), s);
  });
  return out;
}

void add_(Tensor& dst, const Tensor& src_in) {
  check_binary("add_", dst, src_in);
  expect_contiguous("add_", dst, "destination");
  Tensor src = src_in.contiguous();
  dispatch_float("add_", dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (dst.is_cuda())
      LOOM_ON_CUDA("add_", T, cuda::axpby(dst.data<T>(), src.data<T>(), dst.data<T>(), dst.numel(), 1.f, 1.f, stream_of(dst)));
    else
      cpu::axpby(dst.data<T>(), src.data<T>(), dst.data<T>(), dst.numel(), 1.f, 1.f);
  });
}

void fill_(Tensor& t, float value) {
  expect_contiguous("fill_", t, "tensor");
  dispatch_float("fill_", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (t.is_cuda())
      LOOM_ON_CUDA("fill_", T, cuda::fill(t.data<T>(), t.numel(), value, stream_of(t)));
    else
      cpu::fill(t.data<T>(), t.numel(), value);
  });
}

void scale_blocks_(Tensor& t, const std::vector<int64_t>& blocks, float beta) {
  expect_contiguous("scale_blocks_", t, "tensor");
  LOOM_CHECK(t.dim() >= 1, "scale_blocks_: needs a tensor with a first dimension, got ", t.str());
  std::vector<int32_t> index;
  index.reserve(blocks.size());
  for (int64_t b : blocks) {
    LOOM_CHECK(b >= 0 && b < t.size(0), "scale_blocks_: block ", b, " outside ", t.str());
    index.push_back(static_cast<int32_t>(b));
  }
  if (index.empty() || beta == 1.f) return;
  const int64_t block = t.numel() / t.size(0);
  dispatch_float("scale_blocks_", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = static_cast<int64_t>(index.size());
    if (t.is_cuda())
      LOOM_ON_CUDA("scale_blocks_", T, cuda::scale_blocks(t.data<T>(), block, index.data(), n, beta, stream_of(t)));
    else
      cpu::scale_blocks(t.data<T>(), block, index.data(), n, beta);
  });
}

Tensor add_bias(const Tensor& a_in, const Tensor& bias) {
  same_device("add_bias", a_in, bias);
  same_dtype("add_bias", a_in, bias);
  LOOM_CHECK(bias.dim() == 1 && a_in.dim() >= 1 && a_in.size(-1) == bias.size(0), "add_bias: bias ", bias.str(),
             " does not match the last dim of ", a_in.str());
  Tensor a = a_in.contiguous(), b = bias.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  const int64_t cols = b.numel(), rows = cols ? a.numel() / cols : 0;
  dispatch_float("add_bias", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (a.is_cuda())
      LOOM_ON_CUDA("add_bias", T, cuda::add_bias(a.data<T>(), b.data<T>(), out.data<T>(), rows, cols, stream_of(a)));
    else
      cpu::add_bias(a.data<T>(), b.data<T>(), out.data<T>(), rows, cols);
  });
  return out;
}

Tensor softcap(const Tensor& a_in, float cap) {
  LOOM_CHECK(cap > 0.f, "softcap: cap must be positive, got ", cap);
  Tensor a = a_in.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  dispatch_float("softcap", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (a.is_cuda())
      LOOM_ON_CUDA("softcap", T, cuda::softcap_forward(a.data<T>(), out.data<T>(), a.numel(), cap, stream_of(a)));
    else
      cpu::softcap_forward(a.data<T>(), out.data<T>(), a.numel(), cap);
  });
  return out;
}

Tensor softcap_backward(const Tensor& a_in, const Tensor& dout_in, float cap) {
  check_binary("softcap_backward", a_in, dout_in);
  LOOM_CHECK(cap > 0.f, "softcap_backward: cap must be positive, got ", cap);
  Tensor a = a_in.contiguous(), d = dout_in.contiguous();
  Tensor da = Tensor::empty(a.shape(), a.dtype(), a.device());
  dispatch_float("softcap_backward", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (a.is_cuda())
      LOOM_ON_CUDA("softcap_backward", T,
                   cuda::softcap_backward(a.data<T>(), d.data<T>(), da.data<T>(), a.numel(), cap, stream_of(a)));
    else
      cpu::softcap_backward(a.data<T>(), d.data<T>(), da.data<T>(), a.numel(), cap);
  });
  return da;
}

void sum_rows_into(const Tensor& a_in, Tensor& into) {
  same_device("sum_rows", a_in, into);
  LOOM_CHECK(a_in.dim() >= 1 && into.dim() == 1 && into.size(0) == a_in.size(-1), "sum_rows: ", into.str(),
             " cannot hold the column sums of ", a_in.str());
  LOOM_CHECK(into.dtype() == a_in.dtype() || into.dtype() == DType::f32, "sum_rows: output ", into.str(),
             " must be f32 or ", name(a_in.dtype()));
  expect_contiguous("sum_rows", into, "output");
  Tensor a = a_in.contiguous();
  const int64_t cols = into.numel(), rows = cols ? a.numel() / cols : 0;
  dispatch_float("sum_rows", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (into.dtype() == a.dtype()) {
      if (a.is_cuda())
        LOOM_ON_CUDA("sum_rows", T, {
          Tensor ws = Tensor::empty({static_cast<int64_t>(cuda::sum_rows_workspace_bytes(rows, cols))}, DType::u8,
                                    a.device());
          cuda::sum_rows(a.data<T>(), into.data<T>(), rows, cols, true, ws.data_ptr(), stream_of(a));
        });
      else
        cpu::sum_rows(a.data<T>(), into.data<T>(), rows, cols, true);
    } else if constexpr (std::is_same_v<T, bf16>) {
      if (a.is_cuda())
        LOOM_ON_CUDA("sum_rows", T, {
          Tensor ws = Tensor::empty({static_cast<int64_t>(cuda::sum_rows_workspace_bytes(rows, cols))}, DType::u8,
                                    a.device());
          cuda::sum_rows(a.data<T>(), into.data<float>(), rows, cols, true, ws.data_ptr(), stream_of(a));
        });
      else
        cpu::sum_rows(a.data<T>(), into.data<float>(), rows, cols, true);
    } else {
      LOOM_CHECK(false, "sum_rows: ", a.str(), " into ", into.str());
    }
  });
}

Tensor sum_rows(const Tensor& a, DType out) {
  Tensor r = Tensor::zeros({a.size(-1)}, out, a.device());
  sum_rows_into(a, r);
  return r;
}

namespace {
template <bool kSquares>
Tensor reduce(const char* op, const Tensor& a_in) {
  Tensor a = a_in.contiguous();
  Tensor out = Tensor::empty({}, DType::f32, a.device());
  dispatch_float(op, a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (a.is_cuda()) {
      LOOM_ON_CUDA(op, T, {
        float* ws = CudaContext::get(a.device().index).reduce_workspace;
        if (kSquares)
          cuda::sum_squares(a.data<T>(), a.numel(), out.data<float>(), ws, stream_of(a));
        else
          cuda::sum(a.data<T>(), a.numel(), out.data<float>(), ws, stream_of(a));
      });
    } else if (kSquares) {
      cpu::sum_squares(a.data<T>(), a.numel(), out.data<float>());
    } else {
      cpu::sum(a.data<T>(), a.numel(), out.data<float>());
    }
  });
  return out;
}
}  // namespace

Tensor sum(const Tensor& a) { return reduce<false>("sum", a); }
Tensor sum_squares(const Tensor& a) { return reduce<true>("sum_squares", a); }

Tensor grad_norm_coef(const std::vector<Tensor>& grads, float max_norm) {
  const char* op = "grad_norm_coef";
  std::vector<Tensor> gs;
  for (const Tensor& g : grads)
    if (g.defined()) gs.push_back(g.contiguous());
  for (const Tensor& g : gs) same_device(op, gs.front(), g);
  if (!gs.empty() && gs.front().is_cuda()) {
#if LOOM_WITH_CUDA
    std::vector<cuda::GradSpan> spans;
    for (const Tensor& g : gs) {
      LOOM_CHECK(g.dtype() == DType::f32 || g.dtype() == DType::bf16, op, ": gradients must be f32 or bf16 on CUDA, got ",
                 g.str());
      spans.push_back({g.data_ptr(), g.numel(), g.dtype() == DType::bf16});
    }
    Tensor out = Tensor::empty({2}, DType::f32, gs.front().device());
    Tensor ws = Tensor::empty({static_cast<int64_t>(cuda::grad_norm_workspace_floats(spans.size()))}, DType::f32,
                              gs.front().device());
    cuda::grad_norm_coef(spans, max_norm, out.data<float>(), ws.data<float>(), stream_of(out));
    return out;
#else
    LOOM_CHECK(false, op, ": Loom was built without CUDA (LOOM_CUDA=OFF)");
#endif
  }
  Tensor total;
  for (const Tensor& g : gs) total = total.defined() ? add(total, sum_squares(g)) : sum_squares(g);
  const float sum = total.defined() ? total.item() : 0.f;
  const float norm = std::sqrt(sum);
  return Tensor::from_floats({norm, clip_coefficient(norm, max_norm)}, {2});
}

Tensor cat_last(const std::vector<Tensor>& parts, const std::vector<int64_t>& widths) {
  LOOM_CHECK(!parts.empty() && parts.size() == widths.size(), "cat_last: ", parts.size(), " parts and ", widths.size(),
             " widths");
  const Tensor* first = nullptr;
  for (const Tensor& p : parts)
    if (p.defined() && !first) first = &p;
  LOOM_CHECK(first != nullptr, "cat_last: every part is undefined");
  Shape shape = first->shape();
  const int64_t rows = first->numel() / std::max<int64_t>(shape.back(), 1);
  int64_t total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].defined()) {
      same_device("cat_last", *first, parts[i]);
      same_dtype("cat_last", *first, parts[i]);
      LOOM_CHECK(parts[i].size(-1) == widths[i] && parts[i].numel() == rows * widths[i], "cat_last: part ", i, " ",
                 parts[i].str(), " does not fit ", rows, " rows of ", widths[i]);
    }
    total += widths[i];
  }
  shape.back() = total;
  Tensor out = Tensor::empty(shape, first->dtype(), first->device());
  const size_t es = bytes_for(first->dtype(), 1);
  auto* dst = static_cast<char*>(out.data_ptr());
  int64_t col = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor src = parts[i].defined() ? parts[i].contiguous() : Tensor::zeros({rows, widths[i]}, out.dtype(), out.device());
    const size_t w = widths[i] * es, pitch = total * es;
    if (out.is_cuda()) {
#if LOOM_WITH_CUDA
      cuda::copy_2d(src.data_ptr(), int64_t(w), dst + col * es, int64_t(pitch), int64_t(w), rows, stream_of(out));
#endif
    } else {
      const auto* s = static_cast<const char*>(src.data_ptr());
      for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * pitch + col * es, s + r * w, w);
    }
    col += widths[i];
  }
  return out;
}

void copy_rows_(Tensor& dst, const Tensor& src_in) {
  LOOM_CHECK(dst.dim() == 2 && dst.shape() == src_in.shape() && (dst.size(0) <= 1 || dst.strides()[1] == 1) &&
                 (dst.size(0) <= 1 || dst.strides()[0] >= dst.size(1)),
             "copy_rows_: ", src_in.str(), " into ", dst.str(), " (rows with contiguous columns)");
  same_device("copy_rows_", dst, src_in);
  same_dtype("copy_rows_", dst, src_in);
  const Tensor src = src_in.contiguous();
  const int64_t rows = dst.size(0), cols = dst.size(1);
  if (rows == 0 || cols == 0) return;
  const size_t es = bytes_for(dst.dtype(), 1), w = cols * es, pitch = (rows > 1 ? dst.strides()[0] : cols) * es;
  auto* d = static_cast<char*>(dst.data_ptr());
  if (dst.is_cuda()) {
#if LOOM_WITH_CUDA
    cuda::copy_2d(src.data_ptr(), int64_t(w), d, int64_t(pitch), int64_t(w), rows, stream_of(dst));
#endif
  } else {
    const auto* s = static_cast<const char*>(src.data_ptr());
    for (int64_t r = 0; r < rows; ++r) std::memcpy(d + r * pitch, s + r * w, w);
  }
}

}  // namespace loom::ops
