// ops:: RMSNorm, rotary embedding, gated activations and embedding lookup.
#include <algorithm>
#include <tuple>

#include "engine/dispatch.h"
#include "engine/ops.h"
#include "kernels/activation.h"
#include "kernels/embedding.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace loom::ops {
using namespace detail;

namespace {
// [rows, ld] over x's storage from x's first element (x's rows ld apart, the columns after each
// included), or undefined where the storage ends before the last row's ld-th column.
Tensor widen_rows_to(const Tensor& x, int64_t rows, int64_t ld) {
  const auto& storage = x.storage();
  if (!storage || static_cast<size_t>(bytes_for(x.dtype(), x.offset() + rows * ld)) > storage->nbytes()) return Tensor();
  return Tensor::from_storage(storage, {rows, ld}, x.dtype(), x.offset());
}

// rms_norm of x, or with a residual of h = x + residual (then out.h is h): on CUDA the add is
// fused into the norm's pass, on the CPU it is the add op itself.
AddRmsNormOut norm_of(const char* op, const Tensor& x_in, const Tensor* residual, const Tensor& w_in, float eps,
                      bool add_one, int64_t spare) {
  LOOM_CHECK(spare >= 0, op, ": negative spare columns ", spare);
  AddRmsNormOut o;
  const Tensor* src = &x_in;
  if (residual) {
    same_shape(op, x_in, *residual);
    same_dtype(op, x_in, *residual);
    same_device(op, x_in, *residual);
    if (!x_in.is_cuda()) {
      o.h = add(x_in, *residual);
      src = &o.h;
      residual = nullptr;
    }
  }
  same_device(op, *src, w_in);
  same_dtype(op, *src, w_in);
  LOOM_CHECK(w_in.dim() == 1 && src->dim() >= 1 && src->size(-1) == w_in.size(0), op, ": weight ", w_in.str(),
             " does not match the last dim of ", src->str());
  Tensor x = src->contiguous(), w = w_in.contiguous(), r = residual ? residual->contiguous() : Tensor();
  const int64_t cols = w.numel(), rows = cols ? x.numel() / cols : 0;
  if (spare > 0) {
    Shape wide = x.shape();
    wide.back() += spare;
    o.y = Tensor::empty(wide, x.dtype(), x.device()).narrow(-1, 0, cols);
  } else {
    o.y = Tensor::empty(x.shape(), x.dtype(), x.device());
  }
  const int64_t ldy = cols + spare;
  o.rstd = Tensor::empty({rows}, acc_dtype(x.dtype()), x.device());
  if (residual) o.h = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    if (x.is_cuda())
      LOOM_ON_CUDA(op, T, cuda::rms_norm_forward(x.data<T>(), w.data<T>(), o.y.data<T>(), o.rstd.data<A>(), rows, cols,
                                                 eps, add_one, stream_of(x), residual ? r.data<T>() : nullptr,
                                                 residual ? o.h.data<T>() : nullptr, ldy));
    else
      cpu::rms_norm_forward(x.data<T>(), w.data<T>(), o.y.data<T>(), o.rstd.data<A>(), rows, cols, eps, add_one, ldy);
  });
  return o;
}
}  // namespace

RmsNormOut rms_norm(const Tensor& x, const Tensor& w, float eps, bool add_one, int64_t spare) {
  AddRmsNormOut o = norm_of("rms_norm", x, nullptr, w, eps, add_one, spare);
  return {o.y, o.rstd};
}

Tensor rows_of(const Tensor& x) {
  LOOM_CHECK(x.dim() >= 1, "rows_of: a scalar");
  const int64_t d = x.dim(), cols = x.size(-1);
  const Shape& st = x.strides();
  bool even = st[d - 1] == 1 || cols == 1;
  for (int64_t i = 0; even && i + 2 < d; ++i) even = x.size(i) == 1 || st[i] == st[i + 1] * x.size(i + 1);
  if (!even || d == 1 || x.is_contiguous()) return x.reshape({-1, cols});
  const int64_t rows = x.numel() / std::max<int64_t>(cols, 1), ld = st[d - 2];
  if (rows <= 1 || ld < cols) return x.reshape({-1, cols});
  const Tensor all = widen_rows_to(x, rows, ld);
  return all.defined() ? all.narrow(1, 0, cols) : x.reshape({-1, cols});
}

Tensor widen_rows(const Tensor& x, int64_t extra) {
  LOOM_CHECK(x.dim() == 2 && extra >= 0, "widen_rows: ", x.str(), " by ", extra);
  const int64_t rows = x.size(0), cols = x.size(1), ld = rows > 1 ? x.strides()[0] : cols + extra;
  if (x.strides()[1] != 1 || ld < cols + extra) return Tensor();
  const Tensor all = widen_rows_to(x, rows, ld);
  return all.defined() ? all.narrow(1, 0, cols + extra) : all;
}

AddRmsNormOut add_rms_norm(const Tensor& x, const Tensor& r, const Tensor& w, float eps, bool add_one,
                           int64_t spare) {
  return norm_of("add_rms_norm", x, &r, w, eps, add_one, spare);
}

Tensor rms_norm_backward(const Tensor& x_in, const Tensor& w_in, const Tensor& rstd, const Tensor& dy_in, Tensor* dw,
                         bool add_one, const Tensor* dres_in) {
  const char* op = "rms_norm_backward";
  same_shape(op, x_in, dy_in);
  same_dtype(op, x_in, dy_in);
  same_dtype(op, x_in, w_in);
  same_device(op, x_in, dy_in);
  if (dres_in) {
    same_shape(op, x_in, *dres_in);
    same_dtype(op, x_in, *dres_in);
    same_device(op, x_in, *dres_in);
  }
  Tensor x = x_in.contiguous(), w = w_in.contiguous(), dy = dy_in.contiguous();
  const int64_t cols = w.numel(), rows = cols ? x.numel() / cols : 0;
  LOOM_CHECK(rstd.numel() == rows && rstd.dtype() == acc_dtype(x.dtype()), op, ": rstd ", rstd.str(), " for ", x.str());
  if (dw) {
    LOOM_CHECK(dw->numel() == cols && dw->dtype() == acc_dtype(x.dtype()) && dw->is_contiguous(), op, ": dw ",
               dw->str(), " must be a contiguous ", name(acc_dtype(x.dtype())), " [", cols, "]");
    same_device(op, x, *dw);
  }
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  bool added = false;
  dispatch_float(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    A* dwp = dw ? dw->data<A>() : nullptr;
    if (x.is_cuda()) {
      LOOM_ON_CUDA(op, T, {
        Tensor ws = Tensor::empty({static_cast<int64_t>(cuda::rms_norm_backward_workspace_bytes(rows, cols))}, DType::u8,
                                  x.device());
        const Tensor dres = dres_in ? dres_in->contiguous() : Tensor();
        cuda::rms_norm_backward(x.data<T>(), w.data<T>(), rstd.data<A>(), dy.data<T>(), dx.data<T>(), dwp, rows, cols,
                                add_one, ws.data_ptr(), stream_of(x), dres_in ? dres.data<T>() : nullptr);
        added = dres_in != nullptr;
      });
    } else {
      cpu::rms_norm_backward(x.data<T>(), w.data<T>(), rstd.data<A>(), dy.data<T>(), dx.data<T>(), dwp, rows, cols,
                             add_one);
    }
  });
  if (dres_in && !added) dx = add(*dres_in, dx);
  return dx;
}

namespace {
// x [..., heads, head_dim] with tokens = numel / (heads*head_dim) matching positions.
// Checks x against positions and inv_freq; returns its tokens (numel / (heads * head_dim)).
int64_t rope_tokens(const char* op, const Tensor& x, const Tensor& positions, const Tensor& inv_freq) {
  same_device(op, x, positions);
  same_device(op, x, inv_freq);
  expect_dtype(op, positions, DType::i32, "positions");
  expect_dtype(op, inv_freq, DType::f32, "inv_freq");
  LOOM_CHECK(x.dim() >= 3, op, ": x must be [..., heads, head_dim], got ", x.str());
  const int64_t head_dim = x.size(-1), heads = x.size(-2);
  const int64_t tokens = x.numel() / std::max<int64_t>(heads * head_dim, 1);
  LOOM_CHECK(head_dim % 2 == 0 && inv_freq.dim() == 1 && inv_freq.numel() >= 1 && inv_freq.numel() <= head_dim / 2, op,
             ": inv_freq ", inv_freq.str(), " does not fit head_dim ", head_dim, " (at most head_dim / 2 frequencies)");
  LOOM_CHECK(positions.numel() == tokens, op, ": ", positions.numel(), " positions for ", tokens, " tokens of ",
             x.str());
  return tokens;
}

Tensor rope_apply(const char* op, const Tensor& x_in, const Tensor& positions, const Tensor& inv_freq, bool backward,
                  float mscale) {
  const int64_t tokens = rope_tokens(op, x_in, positions, inv_freq);
  const int64_t head_dim = x_in.size(-1), heads = x_in.size(-2), rot = 2 * inv_freq.numel();
  Tensor x = x_in.contiguous(), pos = positions.contiguous(), f = inv_freq.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int32_t* p = pos.data<int32_t>();
    const float* fr = f.data<float>();
    if (x.is_cuda()) {
      LOOM_ON_CUDA(op, T, {
        if (backward)
          cuda::rope_backward(x.data<T>(), y.data<T>(), p, fr, tokens, heads, head_dim, rot, mscale, stream_of(x));
        else
          cuda::rope_forward(x.data<T>(), y.data<T>(), p, fr, tokens, heads, head_dim, rot, mscale, stream_of(x));
      });
    } else if (backward) {
      cpu::rope_backward(x.data<T>(), y.data<T>(), p, fr, tokens, heads, head_dim, rot, mscale);
    } else {
      cpu::rope_forward(x.data<T>(), y.data<T>(), p, fr, tokens, heads, head_dim, rot, mscale);
    }
  });
  return y;
}
}  // namespace

Tensor rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float mscale) {
  return rope_apply("rope", x, positions, inv_freq, false, mscale);
}
Tensor rope_backward(const Tensor& dy, const Tensor& positions, const Tensor& inv_freq, float mscale) {
  return rope_apply("rope_backward", dy, positions, inv_freq, true, mscale);
}

std::pair<Tensor, Tensor> rope_pair(const Tensor& q_in, const Tensor& k_in, const Tensor& positions,
                                    const Tensor& inv_freq, bool backward, float mscale) {
  const char* op = backward ? "rope_pair (backward)" : "rope_pair";
  if (!q_in.defined() || !k_in.defined() || !q_in.is_cuda()) {
    auto one = [&](const Tensor& x) {
      return x.defined() ? rope_apply(op, x, positions, inv_freq, backward, mscale) : Tensor();
    };
    return {one(q_in), one(k_in)};
  }
  same_dtype(op, q_in, k_in);
  [[maybe_unused]] const int64_t tokens = rope_tokens(op, q_in, positions, inv_freq);  // (unused without CUDA)
  rope_tokens(op, k_in, positions, inv_freq);  // as many as q's: the positions are shared
  LOOM_CHECK(k_in.size(-1) == q_in.size(-1), op, ": q ", q_in.str(), " and k ", k_in.str(), " differ in head_dim");
  [[maybe_unused]] const int64_t head_dim = q_in.size(-1), q_heads = q_in.size(-2), k_heads = k_in.size(-2);
  Tensor q = q_in.contiguous(), k = k_in.contiguous(), pos = positions.contiguous(), f = inv_freq.contiguous();
  Tensor qo = Tensor::empty(q.shape(), q.dtype(), q.device()), ko = Tensor::empty(k.shape(), k.dtype(), k.device());
  dispatch_float(op, q.dtype(), [&](auto tag) {
    using T [[maybe_unused]] = decltype(tag);
    LOOM_ON_CUDA(op, T, cuda::rope_pair(q.data<T>(), qo.data<T>(), q_heads, k.data<T>(), ko.data<T>(), k_heads,
                                        pos.data<int32_t>(), f.data<float>(), tokens, head_dim,
                                        2 * f.numel(), mscale, backward, stream_of(q)));
  });
  return {qo, ko};
}

Tensor rope_inv_freq(int64_t head_dim, double theta, Device device) {
  std::vector<float> f = cpu::rope_inv_freq(head_dim, theta);
  Tensor t = Tensor::from_floats(f, {static_cast<int64_t>(f.size())});
  return t.to(device);
}

namespace {
template <bool kGelu>
Tensor glu_forward(const char* op, const Tensor& gate_in, const Tensor& up_in) {
  same_device(op, gate_in, up_in);
  same_dtype(op, gate_in, up_in);
  same_shape(op, gate_in, up_in);
  Tensor g = gate_in.contiguous(), u = up_in.contiguous();
  Tensor out = Tensor::empty(g.shape(), g.dtype(), g.device());
  dispatch_float(op, g.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (g.is_cuda()) {
      LOOM_ON_CUDA(op, T, {
        if (kGelu) cuda::geglu_forward(g.data<T>(), u.data<T>(), out.data<T>(), g.numel(), stream_of(g));
        else cuda::swiglu_forward(g.data<T>(), u.data<T>(), out.data<T>(), g.numel(), stream_of(g));
      });
    } else if (kGelu) {
      cpu::geglu_forward(g.data<T>(), u.data<T>(), out.data<T>(), g.numel());
    } else {
      cpu::swiglu_forward(g.data<T>(), u.data<T>(), out.data<T>(), g.numel());
    }
  });
  return out;
}

// A tensor whose buffer nobody else can see: contiguous and the only holder of its storage.
bool sole_contiguous(const Tensor& t) { return t.is_contiguous() && t.storage().use_count() == 1; }

// in_place: gate_in and up_in were handed over (see swiglu_backward_consuming); each whose buffer
// nobody else sees receives its gradient (the kernels read an element before writing it).
// value (nullable): also the forward's output, written over dout_in where in_place and nobody else
// sees dout's buffer.
template <bool kGelu>
std::pair<Tensor, Tensor> glu_backward(const char* op, const Tensor& gate_in, const Tensor& up_in, const Tensor& dout_in,
                                       bool in_place = false, Tensor* value = nullptr) {
  same_device(op, gate_in, up_in);
  same_dtype(op, gate_in, up_in);
  same_shape(op, gate_in, up_in);
  same_shape(op, gate_in, dout_in);
  same_dtype(op, gate_in, dout_in);
  // Asked before contiguous() below adds holders. gate and up may share one storage (then neither is sole).
  const bool reuse_gate = in_place && sole_contiguous(gate_in), reuse_up = in_place && sole_contiguous(up_in);
  const bool reuse_dout = value && in_place && sole_contiguous(dout_in);
  Tensor g = gate_in.contiguous(), u = up_in.contiguous(), d = dout_in.contiguous();
  Tensor dg = reuse_gate ? gate_in : Tensor::empty(g.shape(), g.dtype(), g.device());
  Tensor du = reuse_up ? up_in : Tensor::empty(g.shape(), g.dtype(), g.device());
  if (value) *value = reuse_dout ? dout_in : Tensor::empty(g.shape(), g.dtype(), g.device());
  dispatch_float(op, g.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* v = value ? value->data<T>() : nullptr;
    if (g.is_cuda()) {
      LOOM_ON_CUDA(op, T, {
        if (kGelu)
          cuda::geglu_backward(g.data<T>(), u.data<T>(), d.data<T>(), dg.data<T>(), du.data<T>(), g.numel(), stream_of(g), v);
        else
          cuda::swiglu_backward(g.data<T>(), u.data<T>(), d.data<T>(), dg.data<T>(), du.data<T>(), g.numel(), stream_of(g), v);
      });
    } else if (kGelu) {
      cpu::geglu_backward(g.data<T>(), u.data<T>(), d.data<T>(), dg.data<T>(), du.data<T>(), g.numel(), v);
    } else {
      cpu::swiglu_backward(g.data<T>(), u.data<T>(), d.data<T>(), dg.data<T>(), du.data<T>(), g.numel(), v);
    }
  });
  return {dg, du};
}
}  // namespace

Tensor swiglu(const Tensor& gate, const Tensor& up) { return glu_forward<false>("swiglu", gate, up); }
std::pair<Tensor, Tensor> swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout) {
  return glu_backward<false>("swiglu_backward", gate, up, dout);
}
std::pair<Tensor, Tensor> swiglu_backward_consuming(Tensor gate, Tensor up, const Tensor& dout) {
  return glu_backward<false>("swiglu_backward", gate, up, dout, true);
}
Tensor geglu(const Tensor& gate, const Tensor& up) { return glu_forward<true>("geglu", gate, up); }
std::pair<Tensor, Tensor> geglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout) {
  return glu_backward<true>("geglu_backward", gate, up, dout);
}
std::pair<Tensor, Tensor> geglu_backward_consuming(Tensor gate, Tensor up, const Tensor& dout) {
  return glu_backward<true>("geglu_backward", gate, up, dout, true);
}
GluGrads glu_backward_with_value(Tensor gate, Tensor up, Tensor dout, bool gelu) {
  GluGrads r;
  std::tie(r.dgate, r.dup) = gelu ? glu_backward<true>("geglu_backward", gate, up, dout, true, &r.value)
                                  : glu_backward<false>("swiglu_backward", gate, up, dout, true, &r.value);
  return r;
}

Tensor embedding(const Tensor& ids_in, const Tensor& table_in) {
  const char* op = "embedding";
  same_device(op, ids_in, table_in);
  expect_dtype(op, ids_in, DType::i32, "ids");
  LOOM_CHECK(table_in.dim() == 2, op, ": table must be [vocab, dim], got ", table_in.str());
  Tensor ids = ids_in.contiguous(), table = table_in.contiguous();
  const int64_t vocab = table.size(0), dim = table.size(1);
  Shape out_shape = ids.shape();
  out_shape.push_back(dim);
  Tensor out = Tensor::empty(out_shape, table.dtype(), table.device());
  dispatch_float(op, table.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (table.is_cuda())
      LOOM_ON_CUDA(op, T, cuda::embedding_forward(ids.data<int32_t>(), table.data<T>(), out.data<T>(), ids.numel(),
                                                  vocab, dim, stream_of(table)));
    else
      cpu::embedding_forward(ids.data<int32_t>(), table.data<T>(), out.data<T>(), ids.numel(), vocab, dim);
  });
  return out;
}

void embedding_backward(const Tensor& ids_in, const Tensor& dout_in, Tensor& dtable) {
  const char* op = "embedding_backward";
  same_device(op, ids_in, dout_in);
  same_device(op, ids_in, dtable);
  expect_dtype(op, ids_in, DType::i32, "ids");
  expect_contiguous(op, dtable, "dtable");
  LOOM_CHECK(dtable.dim() == 2 && dtable.dtype() == acc_dtype(dout_in.dtype()) &&
                 dout_in.numel() == ids_in.numel() * dtable.size(1),
             op, ": dtable ", dtable.str(), " does not fit dout ", dout_in.str(), " for ids ", ids_in.str());
  Tensor ids = ids_in.contiguous(), dout = dout_in.contiguous();
  dispatch_float(op, dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    if (dout.is_cuda())
      LOOM_ON_CUDA(op, T, cuda::embedding_backward(ids.data<int32_t>(), dout.data<T>(), dtable.data<A>(), ids.numel(),
                                                   dtable.size(0), dtable.size(1), stream_of(dout)));
    else
      cpu::embedding_backward(ids.data<int32_t>(), dout.data<T>(), dtable.data<A>(), ids.numel(), dtable.size(0),
                              dtable.size(1));
  });
}

}  // namespace loom::ops
