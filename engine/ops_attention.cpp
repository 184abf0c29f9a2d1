// ops:: causal attention (grouped-query, sliding window, soft-capping, packed segments) and
// softmax cross-entropy.
#include <cmath>

#include "engine/dispatch.h"
#include "engine/ops.h"
#include "kernels/attention.h"
#include "kernels/attention_decode.h"
#include "kernels/cross_entropy.h"

namespace loom::ops {
using namespace detail;

namespace {
AttentionParams attention_params(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const AttentionOptions& opt) {
  same_device(op, q, k);
  same_device(op, q, v);
  same_dtype(op, q, k);
  same_dtype(op, q, v);
  same_shape(op, k, v);
  LOOM_CHECK(q.dim() == 4 && k.dim() == 4, op, ": q must be [batch, seq, heads, head_dim] and k/v [batch, seq, ",
             "kv_heads, head_dim]; got ", q.str(), " and ", k.str());
  LOOM_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3), op, ": q ", q.str(),
             " and k ", k.str(), " disagree on batch, seq or head_dim");
  LOOM_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, op, ": ", q.size(2), " query heads are not a multiple of ",
             k.size(2), " kv heads");
  AttentionParams p;
  p.batch = q.size(0);
  p.seq = q.size(1);
  p.heads = q.size(2);
  p.kv_heads = k.size(2);
  p.head_dim = q.size(3);
  p.scale = opt.scale != 0.f ? opt.scale : 1.f / std::sqrt(static_cast<float>(p.head_dim));
  p.softcap = opt.softcap;
  p.window = effective_window(opt.window, p.seq);
  if (opt.segment_ids.defined()) {
    same_device(op, q, opt.segment_ids);
    expect_dtype(op, opt.segment_ids, DType::i32, "segment_ids");
    expect_contiguous(op, opt.segment_ids, "segment_ids");
    LOOM_CHECK(opt.segment_ids.numel() == p.batch * p.seq, op, ": segment_ids ", opt.segment_ids.str(),
               " must be [", p.batch, ", ", p.seq, "]");
    p.segment_ids = opt.segment_ids.data<int32_t>();
  }
  return p;
}
}  // namespace

AttentionOut attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const AttentionOptions& opt) {
  const char* op = "attention";
  const AttentionParams p = attention_params(op, q_in, k_in, v_in, opt);
  Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  AttentionOut r{Tensor::empty(q.shape(), q.dtype(), q.device()),
                 Tensor::empty({p.batch, p.heads, p.seq}, acc_dtype(q.dtype()), q.device())};
  dispatch_float(op, q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    if (q.is_cuda())
      LOOM_ON_CUDA(op, T, cuda::attention_forward(p, q.data<T>(), k.data<T>(), v.data<T>(), r.out.data<T>(),
                                                  r.lse.data<A>(), stream_of(q)));
    else
      cpu::attention_forward(p, q.data<T>(), k.data<T>(), v.data<T>(), r.out.data<T>(), r.lse.data<A>());
  });
  return r;
}

AttentionGrads attention_backward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& out_in,
                                  const Tensor& dout_in, const Tensor& lse, const AttentionOptions& opt,
                                  const RopeArgs* rope_q) {
  const char* op = "attention_backward";
  const AttentionParams p = attention_params(op, q_in, k_in, v_in, opt);
  same_shape(op, q_in, out_in);
  same_shape(op, q_in, dout_in);
  same_dtype(op, q_in, dout_in);
  LOOM_CHECK(lse.numel() == p.batch * p.heads * p.seq && lse.dtype() == acc_dtype(q_in.dtype()), op, ": lse ",
             lse.str(), " does not fit q ", q_in.str());
  Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous(), o = out_in.contiguous(),
         d = dout_in.contiguous(), l = lse.contiguous();
  AttentionGrads g{Tensor::empty(q.shape(), q.dtype(), q.device()), Tensor::empty(k.shape(), k.dtype(), k.device()),
                   Tensor::empty(v.shape(), v.dtype(), v.device())};
  Tensor pos, freq;
  RopeOfQ rope;
  if (rope_q) {
    same_device(op, q, rope_q->positions);
    same_device(op, q, rope_q->inv_freq);
    expect_dtype(op, rope_q->positions, DType::i32, "positions");
    expect_dtype(op, rope_q->inv_freq, DType::f32, "inv_freq");
    LOOM_CHECK(rope_q->positions.numel() == p.batch * p.seq && rope_q->inv_freq.dim() == 1 &&
                   rope_q->inv_freq.numel() >= 1 && 2 * rope_q->inv_freq.numel() <= p.head_dim && p.head_dim % 2 == 0,
               op, ": q's rotation (positions ", rope_q->positions.str(), ", inv_freq ", rope_q->inv_freq.str(),
               ") does not fit q ", q.str());
    pos = rope_q->positions.contiguous(), freq = rope_q->inv_freq.contiguous();
    rope.positions = pos.data<int32_t>(), rope.inv_freq = freq.data<float>();
    rope.rotary_dim = 2 * freq.numel(), rope.mscale = rope_q->mscale;
  }
  dispatch_float(op, q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    if (q.is_cuda()) {
      LOOM_ON_CUDA(op, T, {
        Tensor ws = Tensor::empty({static_cast<int64_t>(cuda::attention_backward_workspace_bytes(p))}, DType::u8,
                                  q.device());
        cuda::attention_backward(p, q.data<T>(), k.data<T>(), v.data<T>(), o.data<T>(), d.data<T>(), l.data<A>(),
                                 g.dq.data<T>(), g.dk.data<T>(), g.dv.data<T>(), ws.data_ptr(), stream_of(q),
                                 rope_q ? &rope : nullptr);
      });
    } else {
      cpu::attention_backward(p, q.data<T>(), k.data<T>(), v.data<T>(), o.data<T>(), d.data<T>(), l.data<A>(),
                              g.dq.data<T>(), g.dk.data<T>(), g.dv.data<T>(), rope_q ? &rope : nullptr);
    }
  });
  return g;
}

Tensor attention_decode(const Tensor& q_in, const Tensor& k, const Tensor& v, int64_t length,
                        const AttentionOptions& opt) {
  const char* op = "attention_decode";
  same_device(op, q_in, k);
  same_device(op, q_in, v);
  same_dtype(op, q_in, k);
  same_dtype(op, q_in, v);
  same_shape(op, k, v);
  expect_contiguous(op, k, "k cache");
  expect_contiguous(op, v, "v cache");
  LOOM_CHECK(q_in.dim() == 3 && k.dim() == 4 && k.size(0) == q_in.size(0) && k.size(3) == q_in.size(2) &&
                 k.size(2) > 0 && q_in.size(1) % k.size(2) == 0 && length >= 1 && length <= k.size(1),
             op, ": q ", q_in.str(), " does not fit cache ", k.str(), " at length ", length);
  Tensor q = q_in.contiguous();
  DecodeParams p;
  p.batch = q.size(0);
  p.heads = q.size(1);
  p.head_dim = q.size(2);
  p.kv_heads = k.size(2);
  p.capacity = k.size(1);
  p.length = length;
  p.scale = opt.scale != 0.f ? opt.scale : 1.f / std::sqrt(static_cast<float>(p.head_dim));
  p.softcap = opt.softcap;
  p.window = opt.window;
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  dispatch_float(op, q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (q.is_cuda())
      LOOM_ON_CUDA(op, T, cuda::attention_decode(p, q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>(), stream_of(q)));
    else
      cpu::attention_decode(p, q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>());
  });
  return out;
}

namespace {
void check_ce(const char* op, const Tensor& logits, const Tensor& targets) {
  same_device(op, logits, targets);
  expect_dtype(op, targets, DType::i32, "targets");
  LOOM_CHECK(logits.dim() == 2 && targets.numel() == logits.size(0), op, ": logits must be [n, vocab] and targets [n]; got ",
             logits.str(), " and ", targets.str());
}
}  // namespace

CrossEntropyOut cross_entropy(const Tensor& logits_in, const Tensor& targets_in, float softcap, int32_t ignore_index) {
  const char* op = "cross_entropy";
  check_ce(op, logits_in, targets_in);
  Tensor x = logits_in.contiguous(), t = targets_in.contiguous();
  const int64_t n = x.size(0), vocab = x.size(1);
  CrossEntropyOut r{Tensor::empty({n}, acc_dtype(x.dtype()), x.device()), Tensor::empty({n}, acc_dtype(x.dtype()), x.device())};
  dispatch_float(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    if (x.is_cuda())
      LOOM_ON_CUDA(op, T, cuda::cross_entropy_forward(x.data<T>(), t.data<int32_t>(), r.loss.data<A>(), r.lse.data<A>(),
                                                      n, vocab, softcap, ignore_index, stream_of(x)));
    else
      cpu::cross_entropy_forward(x.data<T>(), t.data<int32_t>(), r.loss.data<A>(), r.lse.data<A>(), n, vocab, softcap,
                                 ignore_index);
  });
  return r;
}

Tensor cross_entropy_backward(const Tensor& logits_in, const Tensor& targets_in, const Tensor& lse_in,
                              const Tensor& dloss_in, float softcap, int32_t ignore_index) {
  const char* op = "cross_entropy_backward";
  check_ce(op, logits_in, targets_in);
  Tensor x = logits_in.contiguous(), t = targets_in.contiguous(), lse = lse_in.contiguous(), dl = dloss_in.contiguous();
  const int64_t n = x.size(0), vocab = x.size(1);
  const DType ad = acc_dtype(x.dtype());
  LOOM_CHECK(lse.numel() == n && lse.dtype() == ad && dl.numel() == n && dl.dtype() == ad, op, ": lse ", lse.str(),
             " and dloss ", dl.str(), " must be ", name(ad), " [", n, "]");
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    if (x.is_cuda())
      LOOM_ON_CUDA(op, T, cuda::cross_entropy_backward(x.data<T>(), t.data<int32_t>(), lse.data<A>(), dl.data<A>(),
                                                       dx.data<T>(), n, vocab, softcap, ignore_index, stream_of(x)));
    else
      cpu::cross_entropy_backward(x.data<T>(), t.data<int32_t>(), lse.data<A>(), dl.data<A>(), dx.data<T>(), n, vocab,
                                  softcap, ignore_index);
  });
  return dx;
}

}  // namespace loom::ops
