// ops:: NF4 quantise and dequantise (kernels/nf4.h): shape and dtype checks, then the CPU
// reference or the CUDA kernels.
#include <map>
#include <mutex>

#include "engine/dispatch.h"
#include "engine/ops.h"
#include "kernels/dynamic_map.h"
#include "kernels/nf4.h"

namespace loom::ops {
using namespace detail;

Tensor nf4_nested_code(Device device) {
  static std::mutex mu;
  // Never destroyed: freeing device memory while the CUDA runtime shuts down at exit is an error.
  static auto* cache = new std::map<std::pair<int, int>, Tensor>;
  std::lock_guard<std::mutex> lock(mu);
  Tensor& t = (*cache)[{static_cast<int>(device.type), device.index}];
  if (!t.defined()) {
    std::vector<float> code(256);
    dynamic_map(true, code.data());
    t = Tensor::from_floats(code, {256}).to(device);
  }
  return t;
}

Nf4Parts nf4_quantize(const Tensor& x_in, bool double_quant) {
  const char* op = "nf4_quantize";
  LOOM_CHECK(x_in.dtype() == DType::f32 || x_in.dtype() == DType::bf16, op, ": input must be f32 or bf16, got ",
             x_in.str());
  LOOM_CHECK(x_in.numel() > 0, op, ": empty input ", x_in.str());
  const Tensor x = x_in.contiguous();
  const Device dev = x.device();
  const int64_t n = x.numel(), blocks = nf4_blocks(n);
  Nf4Parts q;
  q.packed = Tensor::empty({nf4_packed_bytes(n)}, DType::u8, dev);
  Tensor absmax = Tensor::empty({blocks}, DType::f32, dev);
  auto quantize = [&](auto tag) {
    using T = decltype(tag);
    if (x.is_cuda())
      LOOM_ON_CUDA(op, T, cuda::nf4_quantize(x.data<T>(), n, q.packed.data<uint8_t>(), absmax.data<float>(), stream_of(x)));
    else
      cpu::nf4_quantize(x.data<T>(), n, q.packed.data<uint8_t>(), absmax.data<float>());
  };
  if (x.dtype() == DType::f32) quantize(float{});
  else quantize(bf16{});
  if (!double_quant) {
    q.absmax = absmax;
    return q;
  }
  q.absmax = Tensor::empty({blocks}, DType::u8, dev);
  q.nested_absmax = Tensor::empty({nf4_nested_blocks(n)}, DType::f32, dev);
  q.nested_code = nf4_nested_code(dev);
  if (x.is_cuda()) {
#if LOOM_WITH_CUDA
    Tensor offset = Tensor::empty({1}, DType::f32, dev);
    const Stream s = stream_of(x);
    cuda::nf4_absmax_mean(absmax.data<float>(), blocks, offset.data<float>(), s);
    cuda::nf4_double_quantize(absmax.data<float>(), blocks, offset.data<float>(), q.nested_code.data<float>(),
                              q.absmax.data<uint8_t>(), q.nested_absmax.data<float>(), s);
    q.offset = offset.item();
#else
    LOOM_CHECK(false, op, ": Loom was built without CUDA (LOOM_CUDA=OFF)");
#endif
  } else {
    q.offset = cpu::nf4_absmax_mean(absmax.data<float>(), blocks);
    cpu::nf4_double_quantize(absmax.data<float>(), blocks, q.offset, q.nested_code.data<float>(),
                             q.absmax.data<uint8_t>(), q.nested_absmax.data<float>());
  }
  return q;
}

namespace {
// The kernels' view of q for n elements on `device`, after checking q's tensors (op names the caller).
Nf4State checked_state(const char* op, const Nf4Parts& q, int64_t n, const Tensor& out) {
  const int64_t blocks = nf4_blocks(n);
  LOOM_CHECK(q.packed.defined() && q.absmax.defined(), op, ": packed or absmax undefined");
  expect_dtype(op, q.packed, DType::u8, "packed");
  same_device(op, q.packed, out);
  same_device(op, q.absmax, out);
  expect_contiguous(op, q.packed, "packed");
  expect_contiguous(op, q.absmax, "absmax");
  LOOM_CHECK(q.packed.numel() == nf4_packed_bytes(n), op, ": packed ", q.packed.str(), " holds ",
             q.packed.numel() * 2, " codes, the output needs ", n);
  LOOM_CHECK(q.absmax.numel() == blocks, op, ": absmax ", q.absmax.str(), " for ", n, " elements needs ", blocks,
             " blocks of ", kNf4Block);
  Nf4State st;
  if (q.nested()) {
    expect_dtype(op, q.absmax, DType::u8, "double-quantised absmax");
    expect_dtype(op, q.nested_absmax, DType::f32, "nested absmax");
    LOOM_CHECK(q.nested_code.defined() && q.nested_code.numel() == 256 && q.nested_code.dtype() == DType::f32, op,
               ": nested code must be f32 [256], got ", q.nested_code.defined() ? q.nested_code.str() : "undefined");
    LOOM_CHECK(q.nested_absmax.numel() == (blocks + kNf4NestedBlock - 1) / kNf4NestedBlock, op, ": nested absmax ",
               q.nested_absmax.str(), " does not cover ", blocks, " blocks in groups of ", kNf4NestedBlock);
    for (const Tensor* t : {&q.nested_absmax, &q.nested_code}) {
      same_device(op, *t, out);
      expect_contiguous(op, *t, "nested state");
    }
    st.qabsmax = q.absmax.data<uint8_t>();
    st.nested_absmax = q.nested_absmax.data<float>();
    st.nested_code = q.nested_code.data<float>();
    st.offset = q.offset;
  } else {
    expect_dtype(op, q.absmax, DType::f32, "plain absmax");
    st.absmax = q.absmax.data<float>();
  }
  return st;
}
}  // namespace

void nf4_dequantize_into(const Nf4Parts& q, Tensor& out) {
  const char* op = "nf4_dequantize";
  const int64_t n = out.numel();
  expect_contiguous(op, out, "output");
  const Nf4State st = checked_state(op, q, n, out);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if (out.is_cuda())
      LOOM_ON_CUDA(op, T, cuda::nf4_dequantize(q.packed.data<uint8_t>(), st, n, out.data<T>(), stream_of(out)));
    else
      cpu::nf4_dequantize(q.packed.data<uint8_t>(), st, n, out.data<T>());
  };
  if (out.dtype() == DType::f32) run(float{});
  else if (out.dtype() == DType::bf16) run(bf16{});
  else LOOM_CHECK(false, op, ": output must be f32 or bf16, got ", out.str());
}

void nf4_dequantize_experts_into(const std::vector<Nf4Parts>& experts, Tensor& out) {
  const char* op = "nf4_dequantize_experts";
  const int64_t count = static_cast<int64_t>(experts.size());
  expect_contiguous(op, out, "output");
  LOOM_CHECK(count > 0 && out.dim() >= 1 && out.size(0) == count, op, ": an output [", count, ", ...] for ", count,
             " experts, got ", out.str());
  const int64_t n = out.numel() / count;
  std::vector<Nf4State> states;
  std::vector<const uint8_t*> packed;
  for (const Nf4Parts& q : experts) {
    states.push_back(checked_state(op, q, n, out));
    packed.push_back(q.packed.data<uint8_t>());
  }
  auto run = [&](auto tag) {
    using T = decltype(tag);
    std::vector<T*> outs;
    for (int64_t e = 0; e < count; ++e) outs.push_back(out.data<T>() + e * n);
    if (out.is_cuda()) {
      LOOM_ON_CUDA(op, T, cuda::nf4_dequantize_experts(packed, states, n, outs, stream_of(out)));
    } else {
      for (int64_t e = 0; e < count; ++e) cpu::nf4_dequantize(packed[e], states[e], n, outs[e]);
    }
  };
  if (out.dtype() == DType::f32) run(float{});
  else if (out.dtype() == DType::bf16) run(bf16{});
  else LOOM_CHECK(false, op, ": output must be f32 or bf16, got ", out.str());
}

Tensor nf4_dequantize(const Nf4Parts& q, const Shape& shape, DType dtype) {
  LOOM_CHECK(q.packed.defined(), "nf4_dequantize: packed undefined");
  Tensor out = Tensor::empty(shape, dtype, q.packed.device());
  nf4_dequantize_into(q, out);
  return out;
}

}  // namespace loom::ops
