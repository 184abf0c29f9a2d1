// ops_lora.h: the LoRA backward's products of dy on the CPU reference kernel, the CUDA kernel, or
// (operands the kernel does not take) two GEMMs.
#include "engine/ops_lora.h"

#include "engine/dispatch.h"
#include "engine/memory.h"
#include "engine/ops.h"
#include "kernels/lora_dy.h"

namespace loom::ops {
using namespace detail;

LoraDyProducts lora_dy_products(const Tensor& dy_in, const Tensor& b_in, const Tensor& t_in, int m, float alpha) {
  const char* op = "lora_dy_products";
  for (const Tensor* x : {&dy_in, &b_in, &t_in}) expect_dtype(op, *x, DType::bf16, "dy, b and t");
  same_device(op, dy_in, b_in);
  same_device(op, dy_in, t_in);
  LOOM_CHECK(m >= 1 && dy_in.dim() == 2 && b_in.dim() == 2 && t_in.dim() == 2 && b_in.size(0) == dy_in.size(1) &&
                 t_in.size(0) == dy_in.size(0) && b_in.size(1) == t_in.size(1) && b_in.size(1) % m == 0 &&
                 b_in.size(1) > 0,
             op, ": dy ", dy_in.str(), ", b ", b_in.str(), " and t ", t_in.str(), " are not [n, out], [out, ", m,
             " r] and [n, ", m, " r]");
  const int64_t n = dy_in.size(0), out = dy_in.size(1), r = b_in.size(1) / m;
  int64_t ld_dy = 0, ld_b = 0, ld_t = 0;
  // Rows any pitch apart go in as they are (B's parts are two of four column blocks of [out, 4r]).
  const Tensor dy = gemm_operand(dy_in, ld_dy), b = gemm_operand(b_in, ld_b), t = gemm_operand(t_in, ld_t);
  LoraDyProducts p;
  // db is an adapter's gradient: made in the long-lived pool, where autograd keeps it as it is.
  auto db_storage = [&] {
    const LongLivedPoolScope gradient;
    return Tensor::empty({out, r}, DType::f32, dy.device());
  };
  if (dy.is_cpu()) {
    p.dt = Tensor::empty({n, r}, DType::f32, dy.device());
    p.db = db_storage();
    cpu::lora_dy_products(dy.data<bf16>(), ld_dy, b.data<bf16>(), ld_b, t.data<bf16>(), ld_t, n, out, r, m, alpha,
                          p.dt.data<float>(), p.db.data<float>());
    return p;
  }
#if LOOM_WITH_CUDA
  // The kernel where it beats the two GEMMs: a wide dy. H100, rank 16 (bench lora_dy_*, session 49):
  // [16384, 8192] 147 us against 188, [8192, 14336] 145 against 165; [16384, 2048] 62 against 51 and
  // [16384, 512] 78 against 15 (its fixed costs: b's strip per block, the partials and their sums).
  constexpr int64_t kMinOut = 8192;
  if (out >= kMinOut && cuda::lora_dy_products_supported(dy.data<bf16>(), ld_dy, b.data<bf16>(), ld_b, t.data<bf16>(), ld_t, out, r, m)) {
    p.dt = Tensor::empty({n, r}, DType::f32, dy.device());
    p.db = db_storage();
    Tensor work = Tensor::empty({cuda::lora_dy_products_workspace(n, out, r, m)}, DType::f32, dy.device());
    cuda::lora_dy_products(dy.data<bf16>(), ld_dy, b.data<bf16>(), ld_b, t.data<bf16>(), ld_t, n, out, r, m, alpha,
                           p.dt.data<float>(), p.db.data<float>(), work.data<float>(), stream_of(dy));
    return p;
  }
#endif
  // Two GEMMs (each reads dy); db's column blocks summed, dt's left to the caller (dt_blocks).
  p.dt = matmul(dy, b, false, false, DType::f32);
  p.dt_blocks = m;
  const Tensor db_blocks = matmul(dy, t, true, false, DType::f32);
  {
    const LongLivedPoolScope gradient;
    p.db = block_sum(db_blocks, m, alpha);
  }
  return p;
}

}  // namespace loom::ops
