// The one cuBLASLt wrapper (kernels/gemm.h): row-major batched GEMM mapped onto column-major
// cuBLASLt by swapping operands, with descriptors and algorithms cached per shape: the heuristic's
// first, or the fastest of its first few timed on the shape's first call (GemmAlgoChoice).
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/gemm.h"

// The forward declaration in kernels/gemm.h must name the very type cublasLt.h declares.
static_assert(std::is_same_v<cublasLtHandle_t, cublasLtContext*>);


namespace loom::cuda {
namespace {

cudaDataType_t cuda_type(GemmType t) { return t == GemmType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Largest power of two (at most 256) dividing the address of every batch item: cuBLASLt's
// heuristic otherwise assumes 256-byte aligned buffers and may pick an algorithm that faults on
// offset views. The batch stride is folded in (conservatively) so odd strides count too.
uint32_t alignment_of(const void* p, int64_t batch, int64_t stride, GemmType t) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (batch > 1) a |= static_cast<uintptr_t>(stride) * gemm_type_size(t);
  uint32_t align = 256;
  while (align > 1 && (a % align) != 0) align >>= 1;
  return align;
}
struct Alignments {
  uint32_t a, b, c;  // of our A, B, C
};
Alignments alignments(const GemmArgs& g) {
  const uint32_t c = alignment_of(g.c, g.batch, g.stride_c, g.c_type);
  return {alignment_of(g.a, g.batch, g.stride_a, g.ab_type), alignment_of(g.b, g.batch, g.stride_b, g.ab_type),
          g.c_in ? std::min(c, alignment_of(g.c_in, g.batch, g.stride_c, g.c_type)) : c};
}
// C read from another buffer than D is written to (GemmArgs::c_in): cuBLASLt may run other kernels
// then (nvjet's `bx` where in place runs `badd`), so such calls get plans of their own.
bool apart(const GemmArgs& g) {
  return g.beta != 0.f && g.c_in != nullptr && g.c_in != g.c;
}

// Descriptors for one cached problem; destroyed with the cache entry.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // in cuBLASLt's (swapped) roles
  cublasLtMatmulAlgo_t algo{};                   // the one the calls run
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's answers, best first (kTimed times them)
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

using PlanKey = std::array<int64_t, 23>;

PlanKey plan_key(const GemmArgs& g, cublasLtHandle_t handle, size_t ws_bytes, int device, GemmAlgoChoice choice) {
  const Alignments al = alignments(g);
  return {g.m, g.n, g.k, g.batch, g.trans_a, g.trans_b, g.lda, g.ldb, g.ldc,
          g.batch > 1 ? g.stride_a : 0, g.batch > 1 ? g.stride_b : 0, g.batch > 1 ? g.stride_c : 0,
          static_cast<int64_t>(g.ab_type), static_cast<int64_t>(g.c_type),
          al.a, al.b, al.c,
          static_cast<int64_t>(ws_bytes), static_cast<int64_t>(reinterpret_cast<uintptr_t>(handle)), device,
          static_cast<int64_t>(choice),
          // Whether C is read: cuBLASLt runs other kernels for beta = 0 (nvjet's `bz`) than for an
          // accumulation (`badd`), so a timed choice holds for one of the two.
          choice == GemmAlgoChoice::kTimed && g.beta != 0.f ? 1 : 0, apart(g) ? 1 : 0};
}

void set_batch(cublasLtMatrixLayout_t layout, int32_t batch, int64_t stride) {
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                     sizeof batch));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                     &stride, sizeof stride));
}

// Row-major C [m, n] = op(A) op(B) is column-major C^T [n, m] = op(B)^T op(A)^T. A row-major
// stored [r, c] matrix with ld is the column-major [c, r] matrix with the same ld, so:
//   cuBLASLt "A" = our B memory: stored row-major [k, n] -> col-major [n, k] = op(B)^T, no transpose;
//                  stored [n, k] (trans_b) -> col-major [k, n], transposed by cuBLASLt.
//   cuBLASLt "B" = our A memory: stored [m, k] -> col-major [k, m] = op(A)^T, no transpose;
//                  stored [k, m] (trans_a) -> col-major [m, k], transposed by cuBLASLt.
//   cuBLASLt "C"/"D" = our C memory: col-major [n, m] with ldc.
// `wanted`: how many of the heuristic's answers to keep as candidates (at least the first).
std::unique_ptr<Plan> make_plan(const GemmArgs& g, cublasLtHandle_t handle, size_t ws_bytes, int wanted) {
  auto p = std::make_unique<Plan>();
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_lt_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_lt_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof op_lt_a));
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof op_lt_b));

  const cudaDataType_t ab = cuda_type(g.ab_type), ct = cuda_type(g.c_type);
  // Layout rows/cols describe the column-major matrix as stored (before the transpose).
  const uint64_t la_rows = g.trans_b ? g.k : g.n, la_cols = g.trans_b ? g.n : g.k;
  const uint64_t lb_rows = g.trans_a ? g.m : g.k, lb_cols = g.trans_a ? g.k : g.m;
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab, la_rows, la_cols, g.ldb));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab, lb_rows, lb_cols, g.lda));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, ct, g.n, g.m, g.ldc));
  if (g.batch > 1) {
    const int32_t batch = static_cast<int32_t>(g.batch);
    set_batch(p->a, batch, g.stride_b);
    set_batch(p->b, batch, g.stride_a);
    set_batch(p->c, batch, g.stride_c);
  }

  cublasLtMatmulPreference_t pref = nullptr;
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(std::max(wanted, 1)));
  int found = 0;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  {
    const uint64_t ws = ws_bytes;
    const Alignments al = alignments(g);
    const uint32_t al_a = al.b, al_b = al.a, al_c = al.c;  // cuBLASLt's A is our B and vice versa
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(handle, p->op, p->a, p->b, p->c, p->c, pref, static_cast<int>(results.size()),
                                          results.data(), &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  LOOM_CUBLAS_CHECK(st);
  LOOM_CHECK(found > 0 && results[0].state == CUBLAS_STATUS_SUCCESS,
             "cuda gemm: cuBLASLt found no algorithm for m=", g.m, " n=", g.n, " k=", g.k, " batch=", g.batch,
             " trans_a=", g.trans_a, " trans_b=", g.trans_b, " lda=", g.lda, " ldb=", g.ldb, " ldc=", g.ldc, " ",
             gemm_type_name(g.ab_type), "->", gemm_type_name(g.c_type), " workspace=", ws_bytes, " bytes");
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) p->candidates.push_back(results[i].algo);
  p->algo = p->candidates.front();
  return p;
}

// Elements from C's first to its last (the batch items' strides included).
int64_t c_extent(const GemmArgs& g) {
  return (g.batch > 1 ? (g.batch - 1) * g.stride_c : 0) + (g.m - 1) * g.ldc + g.n;
}

// kTimed: each candidate runs once untimed, then in kRounds rounds (every candidate once a round, in
// turn, so that a change of clock or a neighbour's load falls on all of them alike) kReps times between
// two events, on g's own A and B, in place on a stream-ordered scratch the size of C that starts as a
// copy of C when beta != 0 (C itself is left alone; with C apart, GemmArgs::c_in, the trials read C_in
// and write the scratch, as those calls do). In place, as the real call runs: with C and D
// apart the trials ran other nvjet kernels (`bx`, where the in-place calls run `badd`: session 41's H200
// profile), and the gate/up input gradient's timed choice then ran about 5 % slower than the heuristic's
// in the benchmark on both GPUs; timed in place, every product's choice is at least as fast (H100,
// bench/results/session42: that one 1.013x the heuristic's). A candidate's time is its
// fastest round; the fastest candidate becomes p.algo where it beats the heuristic's first by more than
// 2 %. Returns without changing p.algo when the scratch cannot be had or the stream is being captured;
// a candidate that fails to launch is skipped.
void time_candidates(Plan& p, const GemmArgs& g, cublasLtHandle_t handle, GemmWorkspace ws, Stream s) {
  if (p.candidates.size() < 2) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    return;
  }
  // What the trials hold goes back on every way out, a thrown CUDA error's too.
  struct Held {
    void* d = nullptr;
    Stream s;
    std::vector<cudaEvent_t> ev;
    ~Held() {
      for (cudaEvent_t e : ev)
        if (e) cudaEventDestroy(e);
      if (d) cudaFreeAsync(d, s);
    }
  } held{nullptr, s, {}};
  const size_t c_bytes = static_cast<size_t>(c_extent(g)) * gemm_type_size(g.c_type);
  if (cudaMallocAsync(&held.d, c_bytes, s) != cudaSuccess) {
    (void)cudaGetLastError();  // no room for the scratch: the heuristic's pick stands
    held.d = nullptr;
    return;
  }
  // C apart from D (c_in): the trials read it there and write the scratch, as the calls will.
  const void* c_read = apart(g) ? g.c_in : held.d;
  if (g.beta != 0.f && !apart(g)) LOOM_CUDA_CHECK(cudaMemcpyAsync(held.d, g.c, c_bytes, cudaMemcpyDeviceToDevice, s));
  // Four calls a window: the events' resolution (about 0.5 us) stays under 2 % of a 25 us product's window.
  constexpr int kRounds = 3, kReps = 4;
  const float alpha = g.alpha, beta = g.beta;
  const size_t n = p.candidates.size();
  auto run = [&](size_t i) {
    return cublasLtMatmul(handle, p.op, &alpha, g.b, p.a, g.a, p.b, &beta, c_read, p.c, held.d, p.c,
                          &p.candidates[i], ws.ptr, ws.bytes, s) == CUBLAS_STATUS_SUCCESS;
  };
  auto event = [&](size_t i, int round, int end) -> cudaEvent_t& { return held.ev[(i * kRounds + round) * 2 + end]; };
  held.ev.assign(2 * kRounds * n, nullptr);
  for (auto& e : held.ev) LOOM_CUDA_CHECK(cudaEventCreate(&e));
  std::vector<bool> ran(n, false);
  for (size_t i = 0; i < n; ++i) ran[i] = run(i);
  for (int round = 0; round < kRounds; ++round)
    for (size_t i = 0; i < n; ++i) {
      if (!ran[i]) continue;
      LOOM_CUDA_CHECK(cudaEventRecord(event(i, round, 0), s));
      for (int r = 0; r < kReps && ran[i]; ++r) ran[i] = run(i);
      LOOM_CUDA_CHECK(cudaEventRecord(event(i, round, 1), s));
    }
  (void)cudaGetLastError();  // a candidate's failed launch is not the caller's error
  void* d = held.d;
  held.d = nullptr;
  LOOM_CUDA_CHECK(cudaFreeAsync(d, s));
  float first = -1.f, best = -1.f;
  size_t best_i = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!ran[i]) continue;
    float fastest = -1.f;
    for (int round = 0; round < kRounds; ++round) {
      float ms = 0.f;
      LOOM_CUDA_CHECK(cudaEventSynchronize(event(i, round, 1)));
      LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, event(i, round, 0), event(i, round, 1)));
      if (fastest < 0.f || ms < fastest) fastest = ms;
    }
    if (i == 0) first = fastest;
    if (best < 0.f || fastest < best) best = fastest, best_i = i;
  }
  if (best >= 0.f && (first < 0.f || best < 0.98f * first)) p.algo = p.candidates[best_i];
}

// Cached plans; bounded so a stream of ever-new shapes cannot grow it without limit.
constexpr size_t kMaxPlans = 4096;
std::mutex g_plans_mutex;
std::map<PlanKey, std::shared_ptr<const Plan>>& plans() {
  static auto* m = new std::map<PlanKey, std::shared_ptr<const Plan>>();  // never destroyed: outlives callers at exit
  return *m;
}

}  // namespace

void gemm(const GemmArgs& g, cublasLtHandle_t handle, GemmWorkspace ws, Stream s, GemmAlgoChoice choice) {
  check_gemm_args(g, "cuda");
  LOOM_CHECK(g.ab_type != GemmType::kF64, "cuda gemm: f64 is CPU only");
  LOOM_CHECK(handle != nullptr, "cuda gemm: null cublasLt handle");
  LOOM_CHECK(ws.bytes == 0 || (ws.ptr != nullptr && reinterpret_cast<uintptr_t>(ws.ptr) % 256 == 0),
             "cuda gemm: workspace of ", ws.bytes, " bytes must be non-null and 256-byte aligned");
  LOOM_CHECK(g.batch <= INT32_MAX, "cuda gemm: batch ", g.batch, " exceeds cuBLASLt's int32 batch count");
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));

  const PlanKey key = plan_key(g, handle, ws.bytes, device, choice);
  std::shared_ptr<const Plan> plan;  // shared: a concurrent clear() cannot free it under us
  {
    std::lock_guard<std::mutex> lock(g_plans_mutex);
    auto& cache = plans();
    auto it = cache.find(key);
    if (it == cache.end()) {
      if (cache.size() >= kMaxPlans) cache.clear();
      const bool timed = choice == GemmAlgoChoice::kTimed;
      std::unique_ptr<Plan> made = make_plan(g, handle, ws.bytes, timed ? kGemmTimedCandidates : 1);
      if (timed) time_candidates(*made, g, handle, ws, s);
      it = cache.emplace(key, std::move(made)).first;
    }
    plan = it->second;
  }
  // The swap: cuBLASLt's A is our B, its B is our A; C is read (beta != 0) from c_in or in place, and
  // D written to c (one layout for both).
  const float alpha = g.alpha, beta = g.beta;
  const void* c_read = apart(g) ? g.c_in : g.c;
  LOOM_CUBLAS_CHECK(cublasLtMatmul(handle, plan->op, &alpha, /*A=*/g.b, plan->a, /*B=*/g.a, plan->b, &beta,
                                   c_read, plan->c, g.c, plan->c, &plan->algo, ws.ptr, ws.bytes, s));
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace loom::cuda
