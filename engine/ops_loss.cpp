// ops:: fused linear + cross-entropy (lm_head and loss in one pass, no [n, vocab] logits) and the
// device-scalar scale its backward uses.
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "kernels/linear_cross_entropy.h"

namespace loom::ops {
using namespace detail;

LinearCrossEntropyOut linear_cross_entropy(const Tensor& h_in, const Tensor& w_in, const Tensor& targets_in,
                                           const LinearCrossEntropyOptions& opt) {
  const char* op = "linear_cross_entropy";
  same_device(op, h_in, w_in);
  same_device(op, h_in, targets_in);
  same_dtype(op, h_in, w_in);
  expect_dtype(op, targets_in, DType::i32, "targets");
  LOOM_CHECK(h_in.dim() == 2 && w_in.dim() == 2 && h_in.size(1) == w_in.size(1) && targets_in.numel() == h_in.size(0),
             op, ": h must be [n, hidden], w [vocab, hidden] and targets [n]; got ", h_in.str(), ", ", w_in.str(),
             " and ", targets_in.str());
  LOOM_CHECK(opt.softcap >= 0.f, op, ": softcap must be >= 0 (0 = off), got ", opt.softcap);
  Tensor h = h_in.contiguous(), w = w_in.contiguous(), t = targets_in.contiguous();
  const int64_t n = h.size(0), hidden = h.size(1), vocab = w.size(0);
  const DType ad = acc_dtype(h.dtype());
  LinearCrossEntropyOut r;
  r.loss = Tensor::empty({}, ad, h.device());
  if (opt.need_dh) r.dh = Tensor::empty(h.shape(), h.dtype(), h.device());
  if (opt.need_dw) r.dw = Tensor::empty(w.shape(), ad, h.device());  // overwritten
  dispatch_float(op, h.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    T* dh = opt.need_dh ? r.dh.data<T>() : nullptr;
    A* dw = opt.need_dw ? r.dw.data<A>() : nullptr;
    if (h.is_cuda()) {
#if LOOM_WITH_CUDA
      LOOM_ON_CUDA(op, T, {
        CudaContext& ctx = CudaContext::get(h.device().index);
        const size_t bytes = cuda::linear_cross_entropy_scratch_bytes(n, vocab, opt.chunk_rows, std::is_same_v<T, bf16>);
        Tensor scratch = Tensor::empty({static_cast<int64_t>(bytes)}, DType::u8, h.device());
        cuda::linear_cross_entropy(h.data<T>(), w.data<T>(), t.data<int32_t>(), r.loss.data<A>(), dh, dw, n, vocab,
                                   hidden, opt.softcap, opt.ignore_index, opt.chunk_rows, scratch.data_ptr(),
                                   ctx.cublaslt, GemmWorkspace{ctx.gemm_workspace, ctx.gemm_workspace_bytes},
                                   ctx.stream);
      });
#else
      LOOM_ON_CUDA(op, T, (void)0);
#endif
    } else {
      cpu::linear_cross_entropy(h.data<T>(), w.data<T>(), t.data<int32_t>(), r.loss.data<A>(), dh, dw, n, vocab,
                                hidden, opt.softcap, opt.ignore_index, opt.chunk_rows);
    }
  });
  return r;
}

void scale_by_scalar_(Tensor& x, const Tensor& scalar) {
  const char* op = "scale_by_scalar_";
  same_device(op, x, scalar);
  expect_contiguous(op, x, "x");
  LOOM_CHECK(scalar.numel() == 1 && scalar.dtype() == acc_dtype(x.dtype()), op, ": scalar ", scalar.str(),
             " must hold one ", name(acc_dtype(x.dtype())), " for ", x.str());
  Tensor s = scalar.contiguous();
  dispatch_float(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    if (x.is_cuda())
      LOOM_ON_CUDA(op, T, cuda::scale_by_scalar(x.data<T>(), s.data<A>(), x.numel(), stream_of(x)));
    else
      cpu::scale_by_scalar(x.data<T>(), s.data<A>(), x.numel());
  });
}

}  // namespace loom::ops
