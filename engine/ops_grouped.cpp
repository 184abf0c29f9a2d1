// ops:: grouped products of mixture-of-experts layers (engine/ops.h): shape and dtype checks, the
// per-expert problem list (kernels/grouped_gemm.h), and the backend that runs it.
#include "engine/ops_grouped.h"

#include "engine/dispatch.h"
#include "engine/ops.h"
#include "kernels/grouped_gemm_tma.h"

namespace loom::ops {
namespace detail {
namespace {

void check_operands(const char* op, const Tensor& a, const Tensor& b, const Tensor& c) {
  same_device(op, a, b);
  same_device(op, a, c);
  same_dtype(op, a, b);
  LOOM_CHECK(c.dtype() == a.dtype() || (a.dtype() == DType::bf16 && c.dtype() == DType::f32), op, ": the output ",
             c.str(), " must have the inputs' dtype (or f32 with bf16 inputs), inputs ", a.str(), " and ", b.str());
  expect_contiguous(op, c, "output");
  // Operands pass as they are (no copy), so one that overlaps the output would be read while written.
  LOOM_CHECK(a.storage() != c.storage() && b.storage() != c.storage(), op, ": the output ", c.str(),
             " shares memory with an operand (", a.str(), ", ", b.str(), ")");
}

// c = beta * c, as an empty product leaves it.
void scale_output(Tensor c, float beta) {
  if (beta == 0.f) fill_(c, 0.f);
  else if (beta != 1.f) c.copy_(scale(c, beta));
}

// second: a dual list's second products (kernels/grouped_gemm.h), or null.
void run_grouped(const char* op, const std::vector<GemmArgs>& problems, Device device, GroupedGemmVariant variant,
                 const std::vector<GemmArgs>* second = nullptr) {
  if (problems.empty()) return;
  if (device.is_cpu()) {
    second ? cpu::grouped_gemm_dual(problems, *second) : cpu::grouped_gemm(problems);
    return;
  }
#if LOOM_WITH_CUDA
  LOOM_CHECK(problems[0].ab_type != GemmType::kF64, op, ": f64 is CPU-only (used for gradient checks)");
  CudaContext& ctx = CudaContext::get(device.index);
  // The pointer arrays of cuBLAS's grouped call: a few KiB from the stream-ordered pool, released
  // in stream order after the call that reads them.
  Tensor pointers = Tensor::empty({static_cast<int64_t>(cuda::grouped_gemm_pointer_slots(problems.size()))},
                                  DType::i64, device);
  const cuda::GroupedGemmContext c{ctx.cublas, ctx.cublaslt, GemmWorkspace{ctx.gemm_workspace, ctx.gemm_workspace_bytes},
                                   ctx.sm_count};
  void** slots = static_cast<void**>(pointers.data_ptr());
  second ? cuda::grouped_gemm_dual(problems, *second, variant, c, slots, ctx.stream)
         : cuda::grouped_gemm(problems, variant, c, slots, ctx.stream);
#else
  LOOM_CHECK(false, op, ": Loom was built without CUDA (LOOM_CUDA=OFF)");
#endif
}

// The TMA-fed kernel (kernels/grouped_gemm_tma.h, clusters of two) runs g (+ g2) when asked for by name
// (kSm90Tma), or for kAuto where kExpertsOnTmaKernel says so, the list rule would give the products to
// the Hopper kernel (not the LoRA factors' thin ones: 256-wide tiles would be mostly padding) and it can
// run them; false: the list's variant runs.
// problems: g's list (row_grouped_problems), which the rule reads.
bool run_tma(const char* op, const RowGroupedGemm& g, const RowGroupedGemm* g2, const std::vector<int64_t>& offsets,
             const std::vector<GemmArgs>& problems, Device device, GroupedGemmVariant variant) {
#if LOOM_WITH_CUDA
  if (variant == GroupedGemmVariant::kAuto && kExpertsOnTmaKernel && !device.is_cpu() &&
      cuda::sm90_grouped_gemm_ready() && sm90_tma_unsupported(g, g2, offsets) == nullptr) {
    const GroupedGemmVariant pick = choose_grouped_gemm(problems, CudaContext::get(device.index).sm_count);
    if (pick == GroupedGemmVariant::kSm90 || pick == GroupedGemmVariant::kSm90Wide) variant = GroupedGemmVariant::kSm90Tma;
  }
#endif
  if (variant != GroupedGemmVariant::kSm90Tma) return false;
  LOOM_CHECK(!device.is_cpu(), op, ": the sm90_tma variant is a CUDA kernel");
#if LOOM_WITH_CUDA
  CudaContext& ctx = CudaContext::get(device.index);
  cuda::sm90_grouped_gemm_tma(g, g2, offsets, 2, ctx.sm_count, ctx.stream);
#else
  LOOM_CHECK(false, op, ": Loom was built without CUDA (LOOM_CUDA=OFF)");
#endif
  return true;
}

}  // namespace

void grouped_matmul_into(const Tensor& a_in, const Tensor& b_in, Tensor& c, const std::vector<int64_t>& offsets,
                         bool trans_b, float alpha, float beta, GroupedGemmVariant variant) {
  const char* op = "grouped_matmul";
  LOOM_CHECK(a_in.dim() == 2 && b_in.dim() == 3 && c.dim() == 2, op, ": needs a [N, K], b [E, ",
             trans_b ? "M, K" : "K, M", "] and c [N, M], got ", a_in.str(), ", ", b_in.str(), " and ", c.str());
  check_operands(op, a_in, b_in, c);
  const int64_t n = a_in.size(0), k = a_in.size(1);
  const int64_t m = trans_b ? b_in.size(1) : b_in.size(2), kb = trans_b ? b_in.size(2) : b_in.size(1);
  LOOM_CHECK(b_in.size(0) + 1 == static_cast<int64_t>(offsets.size()), op, ": b ", b_in.str(), " has ", b_in.size(0),
             " experts but there are ", offsets.size(), " offsets (E + 1 expected)");
  check_group_offsets(op, offsets, n);
  LOOM_CHECK(k == kb && c.size(0) == n && c.size(1) == m, op, ": a ", a_in.str(), " x b ", b_in.str(),
             trans_b ? "^T" : "", " does not give c ", c.str());
  if (n == 0 || m == 0) return;
  if (k == 0) return scale_output(c, beta);
  int64_t lda = 0;
  const Tensor a = gemm_operand(a_in, lda), b = b_in.contiguous();
  RowGroupedGemm g;
  g.a = a.data_ptr(), g.lda = lda;
  g.b = b.data_ptr();
  g.c = c.data_ptr();
  g.k = k, g.m = m;
  g.trans_b = trans_b;
  g.ab_type = gemm_type(op, a.dtype()), g.c_type = gemm_type(op, c.dtype());
  g.alpha = alpha, g.beta = beta;
  const std::vector<GemmArgs> problems = row_grouped_problems(g, offsets);
  if (run_tma(op, g, nullptr, offsets, problems, a.device(), variant)) return;
  run_grouped(op, problems, a.device(), variant);
}

void grouped_matmul_dual_into(const Tensor& a_in, const Tensor& b_in, const Tensor& a2_in, const Tensor& b2_in,
                              Tensor& c, const std::vector<int64_t>& offsets, bool trans_b, float alpha, float beta,
                              GroupedGemmVariant variant) {
  const char* op = "grouped_matmul_dual";
  LOOM_CHECK(a_in.dim() == 2 && b_in.dim() == 3 && a2_in.dim() == 2 && b2_in.dim() == 3 && c.dim() == 2, op,
             ": needs a [N, K], b [E, ", trans_b ? "M, K" : "K, M", "], a2 [N, K2], b2 [E, ", trans_b ? "M, K2" : "K2, M",
             "] and c [N, M], got ", a_in.str(), ", ", b_in.str(), ", ", a2_in.str(), ", ", b2_in.str(), " and ", c.str());
  check_operands(op, a_in, b_in, c);
  check_operands(op, a2_in, b2_in, c);
  same_dtype(op, a_in, a2_in);
  const int64_t n = a_in.size(0), k = a_in.size(1), k2 = a2_in.size(1);
  const int64_t m = trans_b ? b_in.size(1) : b_in.size(2), kb = trans_b ? b_in.size(2) : b_in.size(1);
  const int64_t m2 = trans_b ? b2_in.size(1) : b2_in.size(2), kb2 = trans_b ? b2_in.size(2) : b2_in.size(1);
  LOOM_CHECK(b_in.size(0) + 1 == static_cast<int64_t>(offsets.size()) && b2_in.size(0) == b_in.size(0), op, ": b ",
             b_in.str(), " and b2 ", b2_in.str(), " must have one matrix per expert (", offsets.size() - 1, ")");
  check_group_offsets(op, offsets, n);
  LOOM_CHECK(k == kb && k2 == kb2 && m2 == m && a2_in.size(0) == n && c.size(0) == n && c.size(1) == m, op, ": a ",
             a_in.str(), " x b ", b_in.str(), " and a2 ", a2_in.str(), " x b2 ", b2_in.str(), trans_b ? " (^T)" : "",
             " do not both give c ", c.str());
  if (n == 0 || m == 0) return;
  // One empty product: the other alone.
  if (k == 0) return grouped_matmul_into(a2_in, b2_in, c, offsets, trans_b, alpha, beta, variant);
  if (k2 == 0) return grouped_matmul_into(a_in, b_in, c, offsets, trans_b, alpha, beta, variant);
  int64_t lda = 0, lda2 = 0;
  const Tensor a = gemm_operand(a_in, lda), b = b_in.contiguous(), a2 = gemm_operand(a2_in, lda2), b2 = b2_in.contiguous();
  RowGroupedGemm g;
  g.a = a.data_ptr(), g.lda = lda, g.b = b.data_ptr(), g.c = c.data_ptr();
  g.k = k, g.m = m, g.trans_b = trans_b;
  g.ab_type = gemm_type(op, a.dtype()), g.c_type = gemm_type(op, c.dtype());
  g.alpha = alpha, g.beta = beta;
  RowGroupedGemm g2 = g;
  g2.a = a2.data_ptr(), g2.lda = lda2, g2.b = b2.data_ptr(), g2.k = k2;
  const std::vector<GemmArgs> problems = row_grouped_problems(g, offsets);
  if (run_tma(op, g, &g2, offsets, problems, a.device(), variant)) return;
  const std::vector<GemmArgs> second = row_grouped_problems(g2, offsets);
  run_grouped(op, problems, a.device(), variant, &second);
}

void grouped_matmul_tn_into(const Tensor& a_in, const Tensor& b_in, Tensor& c, const std::vector<int64_t>& offsets,
                            float alpha, float beta, GroupedGemmVariant variant) {
  const char* op = "grouped_matmul_tn";
  LOOM_CHECK(a_in.dim() == 2 && b_in.dim() == 2 && c.dim() == 3, op, ": needs a [N, M], b [N, K] and c [E, M, K], got ",
             a_in.str(), ", ", b_in.str(), " and ", c.str());
  check_operands(op, a_in, b_in, c);
  const int64_t n = a_in.size(0), m = a_in.size(1), k = b_in.size(1);
  LOOM_CHECK(c.size(0) + 1 == static_cast<int64_t>(offsets.size()), op, ": c ", c.str(), " has ", c.size(0),
             " experts but there are ", offsets.size(), " offsets (E + 1 expected)");
  check_group_offsets(op, offsets, n);
  LOOM_CHECK(b_in.size(0) == n && c.size(1) == m && c.size(2) == k, op, ": a ", a_in.str(), "^T x b ", b_in.str(),
             " per expert does not give c ", c.str());
  if (m == 0 || k == 0) return;
  // Experts without rows: an empty sum, C[e] = beta C[e], in one launch for all of them. (One fill
  // each made session 37's profiles of Qwen3-30B-A3B's shape at random init count 365 fill launches
  // a step over 4 layers: by my reading, the many experts such a router leaves without tokens.)
  std::vector<int64_t> empty;
  for (size_t e = 0; e + 1 < offsets.size(); ++e)
    if (offsets[e] == offsets[e + 1]) empty.push_back(static_cast<int64_t>(e));
  scale_blocks_(c, empty, beta);
  if (n == 0) return;
  int64_t lda = 0, ldb = 0;
  const Tensor a = gemm_operand(a_in, lda), b = gemm_operand(b_in, ldb);
  ReductionGroupedGemm g;
  g.a = a.data_ptr(), g.lda = lda;
  g.b = b.data_ptr(), g.ldb = ldb;
  g.c = c.data_ptr();
  g.m = m, g.k = k;
  g.ab_type = gemm_type(op, a.dtype()), g.c_type = gemm_type(op, c.dtype());
  g.alpha = alpha, g.beta = beta;
  run_grouped(op, reduction_grouped_problems(g, offsets), a.device(), variant);
}

}  // namespace detail

void grouped_matmul_into(const Tensor& a, const Tensor& b, Tensor& c, const std::vector<int64_t>& offsets,
                         bool trans_b, float alpha, float beta) {
  detail::grouped_matmul_into(a, b, c, offsets, trans_b, alpha, beta, GroupedGemmVariant::kAuto);
}

void grouped_matmul_dual_into(const Tensor& a, const Tensor& b, const Tensor& a2, const Tensor& b2, Tensor& c,
                              const std::vector<int64_t>& offsets, bool trans_b, float alpha, float beta) {
  detail::grouped_matmul_dual_into(a, b, a2, b2, c, offsets, trans_b, alpha, beta, GroupedGemmVariant::kAuto);
}

void grouped_matmul_tn_into(const Tensor& a, const Tensor& b, Tensor& c, const std::vector<int64_t>& offsets,
                            float alpha, float beta) {
  detail::grouped_matmul_tn_into(a, b, c, offsets, alpha, beta, GroupedGemmVariant::kAuto);
}

}  // namespace loom::ops
