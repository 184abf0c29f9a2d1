// ops:: matrix products through the one GEMM wrapper (Eigen on CPU, cuBLASLt on CUDA).
#include <atomic>

#include "engine/dispatch.h"
#include "engine/ops.h"
#include "kernels/bf16_split.h"
#include "kernels/gemm.h"

namespace loom::ops {
using namespace detail;

namespace {

// set_gemm_autotune (ops.h). Measured end to end, Llama-3.2-1B LoRA `none` at 8 x 2048: H200 85,751
// tokens/s timed against 83,955 (session 40), H100 77,622 against 77,336 (session 41); bench
// gemm/bf16/llama1b_* times both product by product (bench/results/session41).
std::atomic<bool> g_gemm_autotune{false};

void run_gemm(const GemmArgs& g, Device device) {
  if (device.is_cpu()) {
    cpu::gemm(g);
    return;
  }
#if LOOM_WITH_CUDA
  LOOM_CHECK(g.ab_type != GemmType::kF64, "matmul: f64 is CPU-only");
  CudaContext& ctx = CudaContext::get(device.index);
  cuda::gemm(g, ctx.cublaslt, GemmWorkspace{ctx.gemm_workspace, ctx.gemm_workspace_bytes}, ctx.stream,
             g_gemm_autotune.load(std::memory_order_relaxed) ? cuda::GemmAlgoChoice::kTimed
                                                              : cuda::GemmAlgoChoice::kHeuristic);
#else
  LOOM_CHECK(false, "matmul: Loom was built without CUDA (LOOM_CUDA=OFF)");
#endif
}

}  // namespace

void set_gemm_autotune(bool on) { g_gemm_autotune.store(on, std::memory_order_relaxed); }
bool gemm_autotune() { return g_gemm_autotune.load(std::memory_order_relaxed); }

void matmul_into(const Tensor& a_in, const Tensor& b_in, Tensor& c, bool trans_a, bool trans_b, float alpha,
                 float beta, const Tensor* c_in) {
  const char* op = "matmul";
  same_device(op, a_in, b_in);
  same_device(op, a_in, c);
  same_dtype(op, a_in, b_in);
  LOOM_CHECK(a_in.dim() >= 2 && b_in.dim() >= 2, op, ": needs matrices, got ", a_in.str(), " and ", b_in.str());
  // The output: contiguous, or a matrix whose rows lie a pitch apart (a view of a wider one's columns).
  const bool pitched = c.dim() == 2 && c.strides()[1] == 1 && c.strides()[0] >= c.size(1);
  LOOM_CHECK(c.is_contiguous() || pitched, op, ": the output must be contiguous or a row-pitched matrix, got ",
             c.str());
  if (c_in) {
    same_device(op, c, *c_in);
    LOOM_CHECK(c_in->shape() == c.shape() && c_in->dtype() == c.dtype() && c_in->strides() == c.strides(), op,
               ": C to read, ", c_in->str(), " (row stride ", c_in->dim() ? c_in->strides()[0] : 0,
               "), must have the output's shape, dtype and strides, ", c.str(), " (row stride ",
               c.dim() ? c.strides()[0] : 0, ")");
  }
  int64_t lda = 0, ldb = 0;
  const Tensor a = gemm_operand(a_in, lda), b = gemm_operand(b_in, ldb);
  // Operands pass as they are (no copy), so one that overlaps the output would be read while written.
  LOOM_CHECK(a.storage() != c.storage() && b.storage() != c.storage(), op, ": the output ", c.str(),
             " shares memory with an operand (", a.str(), ", ", b.str(), ")");
  LOOM_CHECK(!c_in || c_in->storage() != c.storage() || c_in->data_ptr() == c.data_ptr(), op, ": C to read, ",
             c_in->str(), ", overlaps the output ", c.str(), " without being it");
  const int64_t a_rows = a.size(-2), a_cols = a.size(-1), b_rows = b.size(-2), b_cols = b.size(-1);
  const int64_t m = trans_a ? a_cols : a_rows, k = trans_a ? a_rows : a_cols;
  const int64_t kb = trans_b ? b_cols : b_rows, n = trans_b ? b_rows : b_cols;
  LOOM_CHECK(k == kb, op, ": inner dimensions differ: ", a.str(), (trans_a ? "^T" : ""), " x ", b.str(),
             (trans_b ? "^T" : ""));
  // The leading dimensions' product (not numel / (rows x cols), which an empty inner dimension makes 0).
  auto leading = [](const Tensor& t) {
    int64_t p = 1;
    for (int64_t d = 0; d + 2 < t.dim(); ++d) p *= t.size(d);
    return p;
  };
  const int64_t batch = leading(a), b_batch = leading(b);
  LOOM_CHECK(b.dim() == 2 || b_batch == batch, op, ": batch sizes differ: ", a.str(), " and ", b.str());
  LOOM_CHECK(c.numel() == batch * m * n && c.size(-1) == n, op, ": output ", c.str(), " cannot hold [", batch,
             " x ", m, " x ", n, "]");
  LOOM_CHECK(c.is_contiguous() || batch == 1, op, ": a row-pitched output ", c.str(), " takes one product, not ",
             batch);
  GemmArgs g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = batch;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.a = a.data_ptr();
  g.lda = lda;
  g.stride_a = a.dim() == 2 ? 0 : a_rows * a_cols;
  g.b = b.data_ptr();
  g.ldb = ldb;
  g.stride_b = b.dim() == 2 ? 0 : b_rows * b_cols;
  g.c = c.data_ptr();
  g.c_in = c_in ? c_in->data_ptr() : nullptr;
  g.ldc = c.is_contiguous() ? n : c.strides()[0];
  g.stride_c = m * n;
  g.ab_type = gemm_type(op, a.dtype());
  g.c_type = gemm_type(op, c.dtype());
  g.alpha = alpha;
  g.beta = beta;
  if (m == 0 || n == 0 || batch == 0) return;
  if (k == 0) {  // an empty sum: C = beta * C
    if (!c.is_contiguous()) {  // a row-pitched output: its rows written through copy_rows_
      ops::copy_rows_(c, beta == 0.f ? Tensor::zeros(c.shape(), c.dtype(), c.device())
                                     : scale((c_in ? *c_in : c).contiguous(), beta));
    } else if (beta == 0.f) {
      fill_(c, 0.f);
    } else if (c_in || beta != 1.f) {
      c.copy_(scale(c_in ? *c_in : c, beta));
    }
    return;
  }
  // A shared 2-D b with trans_a = false is one big [batch*m, k] x [k, n] product.
  if (b.dim() == 2 && !trans_a && batch > 1) {
    g.m = batch * m;
    g.batch = 1;
  }
  run_gemm(g, a.device());
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, std::optional<DType> out_dtype) {
  LOOM_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: needs matrices, got ", a.str(), " and ", b.str());
  Shape out_shape = a.shape();
  out_shape[out_shape.size() - 2] = trans_a ? a.size(-1) : a.size(-2);
  out_shape.back() = trans_b ? b.size(-2) : b.size(-1);
  Tensor c = Tensor::empty(out_shape, out_dtype.value_or(a.dtype()), a.device());
  matmul_into(a, b, c, trans_a, trans_b);
  return c;
}

Tensor linear(const Tensor& x, const Tensor& w, std::optional<DType> out_dtype) {
  LOOM_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1), "linear: input ", x.str(),
             " does not match weight ", w.str(), " ([out, in])");
  Shape out_shape = x.shape();
  out_shape.back() = w.size(0);
  Tensor x2 = x.reshape({-1, x.size(-1)});
  Tensor y = matmul(x2, w, false, true, out_dtype);
  return y.view(out_shape);
}

namespace {
SplitPattern split_pattern(const char* op, const std::string& pattern) {
  SplitPattern p;
  LOOM_CHECK(!pattern.empty() && pattern.size() <= size_t(kMaxSplitParts), op, ": 1 to 4 parts, got '", pattern, "'");
  for (char c : pattern) {
    LOOM_CHECK(c == 'h' || c == 'l', op, ": parts are 'h' or 'l', got '", pattern, "'");
    p.parts[p.count++] = c;
  }
  return p;
}
}  // namespace

namespace {
// The row pitch of `into`, a [rows, cols] bf16 view with contiguous columns on x's device, for a
// split kernel to write into (checked), or 0 for a new tensor.
int64_t pitch_of(const char* op, const Tensor* into, const Tensor& x, int64_t rows, int64_t cols) {
  if (!into) return 0;
  LOOM_CHECK(into->dtype() == DType::bf16 && into->dim() == 2 && into->size(0) == rows && into->size(1) == cols &&
                 (rows <= 1 || (into->strides()[1] == 1 && into->strides()[0] >= cols)),
             op, ": cannot write [", rows, ", ", cols, "] bf16 rows into ", into->str());
  same_device(op, *into, x);
  return rows > 1 ? into->strides()[0] : cols;
}
}  // namespace

Tensor bf16_split(const Tensor& x_in, const std::string& pattern, Tensor* into) {
  const char* op = "bf16_split";
  expect_dtype(op, x_in, DType::f32, "x");
  LOOM_CHECK(x_in.dim() == 2, op, ": x must be [rows, k], got ", x_in.str());
  const SplitPattern p = split_pattern(op, pattern);
  const Tensor x = x_in.contiguous();
  const int64_t rows = x.size(0), k = x.size(1);
  const int64_t ld = pitch_of(op, into, x, rows, p.count * k);
  Tensor out = into ? *into : Tensor::empty({rows, p.count * k}, DType::bf16, x.device());
  if (rows * k == 0) return out;
  if (x.is_cpu()) {
    cpu::bf16_split(x.data<float>(), out.data<bf16>(), rows, k, p, ld);
  } else {
    LOOM_ON_CUDA(op, float, cuda::bf16_split(x.data<float>(), out.data<bf16>(), rows, k, p, stream_of(x), ld));
  }
  return out;
}

Tensor block_sum(const Tensor& in_t, int m, float alpha) {
  const char* op = "block_sum";
  expect_dtype(op, in_t, DType::f32, "in");
  LOOM_CHECK(in_t.dim() == 2 && m >= 1 && in_t.size(1) % m == 0, op, ": in must be [rows, m * k] with m = ", m,
             ", got ", in_t.str());
  const Tensor in = in_t.contiguous();
  const int64_t rows = in.size(0), k = in.size(1) / m;
  Tensor out = Tensor::empty({rows, k}, DType::f32, in.device());
  if (in.is_cpu()) {
    cpu::block_sum(in.data<float>(), out.data<float>(), rows, k, m, alpha);
  } else {
    LOOM_ON_CUDA(op, float, cuda::block_sum(in.data<float>(), out.data<float>(), rows, k, m, alpha, stream_of(in)));
  }
  return out;
}

std::vector<Tensor> block_sum_split(const Tensor& in_t, int m, float alpha, const std::vector<std::string>& patterns,
                                    Tensor* into_a, Tensor* into_b) {
  const char* op = "block_sum_split";
  expect_dtype(op, in_t, DType::f32, "in");
  LOOM_CHECK(in_t.dim() == 2 && m >= 1 && in_t.size(1) % m == 0, op, ": in must be [rows, m * k] with m = ", m,
             ", got ", in_t.str());
  LOOM_CHECK(patterns.size() == 1 || patterns.size() == 2, op, ": one or two patterns, got ", patterns.size());
  LOOM_CHECK(!into_b || patterns.size() == 2, op, ": into_b given for one pattern");
  // Rows any pitch apart (a column block of a wider matrix) are read where they are.
  const bool pitched = in_t.size(0) > 1 && in_t.strides()[1] == 1 && in_t.strides()[0] >= in_t.size(1);
  const Tensor in = pitched || in_t.is_contiguous() ? in_t : in_t.contiguous();
  const int64_t rows = in.size(0), k = in.size(1) / m, ld_in = pitched ? in.strides()[0] : 0;
  std::vector<SplitPattern> ps;
  std::vector<Tensor> out;
  int64_t ld[2] = {0, 0};
  for (const std::string& pattern : patterns) {
    ps.push_back(split_pattern(op, pattern));
    Tensor* into = out.empty() ? into_a : into_b;
    if (into) {
      ld[out.size()] = pitch_of(op, into, in, rows, ps.back().count * k);
      out.push_back(*into);
    } else {
      out.push_back(Tensor::empty({rows, ps.back().count * k}, DType::bf16, in.device()));
    }
  }
  if (rows * k == 0) return out;
  bf16* b = out.size() > 1 ? out[1].data<bf16>() : nullptr;
  const SplitPattern pb = ps.size() > 1 ? ps[1] : SplitPattern{};
  if (in.is_cpu()) {
    cpu::block_sum_split(in.data<float>(), rows, k, m, alpha, out[0].data<bf16>(), ps[0], b, pb, ld[0], ld[1], ld_in);
  } else {
    LOOM_ON_CUDA(op, float,
                 cuda::block_sum_split(in.data<float>(), rows, k, m, alpha, out[0].data<bf16>(), ps[0], b, pb,
                                       stream_of(in), ld[0], ld[1], ld_in));
  }
  return out;
}

void block_sum_split_batch(const std::vector<SplitJob>& jobs) {
  const char* op = "block_sum_split_batch";
  if (jobs.empty()) return;
  std::vector<loom::SplitJob> raw;
  std::vector<Tensor> ins;  // each job's input with contiguous columns, alive until the launch is queued
  raw.reserve(jobs.size());
  for (const SplitJob& job : jobs) {
    SplitJob j = job;
    expect_dtype(op, j.in, DType::f32, "in");
    LOOM_CHECK(j.in.dim() == 2 && j.m >= 1 && j.in.size(1) % j.m == 0, op, ": in must be [rows, m * k] with m = ", j.m,
               ", got ", j.in.str());
    // Rows any pitch apart are read where they are; anything else (one row, other strides) made contiguous.
    if (!(j.in.size(0) > 1 && j.in.strides()[1] == 1 && j.in.strides()[0] >= j.in.size(1))) j.in = j.in.contiguous();
    ins.push_back(j.in);
    same_device(op, j.in, jobs.front().in);
    LOOM_CHECK(j.out_a.defined() && (j.b.empty() || j.out_b.defined()), op, ": a job without the tensor its parts go into");
    const int64_t rows = j.in.size(0), k = j.in.size(1) / j.m;
    loom::SplitJob r;
    r.a = split_pattern(op, j.a);
    r.lda = pitch_of(op, &j.out_a, j.in, rows, r.a.count * k);
    if (!j.b.empty()) {
      r.b = split_pattern(op, j.b);
      r.ldb = pitch_of(op, &j.out_b, j.in, rows, r.b.count * k);
      r.out_b = j.out_b.data<bf16>();
    }
    r.in = j.in.data<float>(), r.out_a = j.out_a.data<bf16>();
    r.rows = rows, r.k = k, r.ldi = rows > 1 ? j.in.strides()[0] : j.m * k, r.alpha = j.alpha, r.m = j.m;
    raw.push_back(r);
  }
  const Tensor& first = jobs.front().in;
  if (first.is_cpu()) {
    cpu::block_sum_split_batch(raw.data(), static_cast<int>(raw.size()));
  } else {
    LOOM_ON_CUDA(op, float, cuda::block_sum_split_batch(raw.data(), static_cast<int>(raw.size()), stream_of(first)));
  }
}

}  // namespace loom::ops
