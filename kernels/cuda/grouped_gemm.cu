// Grouped GEMMs on CUDA (kernels/grouped_gemm.h): one cublasGemmGroupedBatchedEx call for all the
// experts' products, or one cuBLASLt call each (cuda::gemm); choose_grouped_gemm picks. kSm90, by
// name only, is grouped_gemm_sm90.cu's kernel.
#include <cublas_v2.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/grouped_gemm.h"

// The forward declaration in kernels/grouped_gemm.h must name the very type cublas_api.h declares.
static_assert(std::is_same_v<cublasHandle_t, cublasContext*>);

namespace loom::cuda {
namespace {

// Pointers for up to kChunk problems, passed by value as a kernel argument (3 KiB, under the 4 KiB
// any architecture takes): the launch copies them, so no host buffer has to live until the copy.
constexpr int kChunk = 128;
struct PointerChunk {
  const void* a[kChunk];
  const void* b[kChunk];
  void* c[kChunk];
  int count;
};
static_assert(sizeof(PointerChunk) < 4000, "kernel arguments are limited to 4 KiB");

// pointers[0 .. n) = cuBLAS's A array, [n .. 2n) its B, [2n .. 3n) its C; this chunk's part.
__global__ void write_pointers(PointerChunk chunk, void** pointers, int n, int first) {
  const int i = static_cast<int>(threadIdx.x);
  if (i >= chunk.count) return;
  pointers[first + i] = const_cast<void*>(chunk.a[i]);
  pointers[n + first + i] = const_cast<void*>(chunk.b[i]);
  pointers[2 * n + first + i] = chunk.c[i];
}

cudaDataType_t cuda_type(GemmType t) { return t == GemmType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

// The handle works on stream s with the shared GEMM workspace (cublasSetStream resets the workspace
// to cuBLAS's own pool, so it is set again after).
void bind(cublasHandle_t h, const GemmWorkspace& ws, Stream s) {
  cudaStream_t current = nullptr;
  LOOM_CUBLAS_CHECK(cublasGetStream(h, &current));
  if (current == s) return;
  LOOM_CUBLAS_CHECK(cublasSetStream(h, s));
  if (ws.bytes > 0) LOOM_CUBLAS_CHECK(cublasSetWorkspace(h, ws.ptr, ws.bytes));
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS's A is our B and its B
// our A (as in gemm.cu), with m and n swapped; each problem is a group of one.
void run_cublas_grouped(const std::vector<GemmArgs>& problems, const GroupedGemmContext& c, void** pointers,
                        Stream s) {
  LOOM_CHECK(c.cublas != nullptr, "cuda grouped_gemm: null cuBLAS handle");
  LOOM_CHECK(pointers != nullptr && reinterpret_cast<uintptr_t>(pointers) % alignof(void*) == 0,
             "cuda grouped_gemm: the pointer arrays need ", grouped_gemm_pointer_slots(problems.size()),
             " aligned device slots");
  const int n = static_cast<int>(problems.size());
  std::vector<cublasOperation_t> op_a(n), op_b(n);
  std::vector<int64_t> m(n), nn(n), k(n), lda(n), ldb(n), ldc(n), group_size(n, 1);
  std::vector<float> alpha(n), beta(n);
  for (int first = 0; first < n; first += kChunk) {
    PointerChunk chunk{};
    chunk.count = std::min(kChunk, n - first);
    for (int i = 0; i < chunk.count; ++i) {
      const GemmArgs& p = problems[first + i];
      chunk.a[i] = p.b, chunk.b[i] = p.a, chunk.c[i] = p.c;
    }
    write_pointers<<<1, kChunk, 0, s>>>(chunk, pointers, n, first);
    LOOM_CUDA_LAUNCH_CHECK();
  }
  for (int i = 0; i < n; ++i) {
    const GemmArgs& p = problems[i];
    op_a[i] = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    op_b[i] = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    m[i] = p.n, nn[i] = p.m, k[i] = p.k;
    lda[i] = p.ldb, ldb[i] = p.lda, ldc[i] = p.ldc;
    alpha[i] = p.alpha, beta[i] = p.beta;
  }
  bind(c.cublas, c.ws, s);
  const cudaDataType_t ab = cuda_type(problems[0].ab_type), ct = cuda_type(problems[0].c_type);
  // Scales are host f32 (the handle's default pointer mode: cuBLAS refuses device mode here).
  LOOM_CUBLAS_CHECK(cublasGemmGroupedBatchedEx_64(
      c.cublas, op_a.data(), op_b.data(), m.data(), nn.data(), k.data(), alpha.data(),
      const_cast<const void* const*>(pointers), ab, lda.data(), const_cast<const void* const*>(pointers + n), ab,
      ldb.data(), beta.data(), pointers + 2 * n, ct, ldc.data(), n, group_size.data(), CUBLAS_COMPUTE_32F));
  LOOM_CUDA_LAUNCH_CHECK();
}

bool is_sm90(GroupedGemmVariant v) { return v == GroupedGemmVariant::kSm90 || v == GroupedGemmVariant::kSm90Wide; }
int sm90_tile_n(GroupedGemmVariant v) { return v == GroupedGemmVariant::kSm90Wide ? 256 : 128; }

}  // namespace

void grouped_gemm(const std::vector<GemmArgs>& problems, GroupedGemmVariant variant, const GroupedGemmContext& c,
                  void** pointers, Stream s) {
  for (const GemmArgs& p : problems) {
    check_gemm_args(p, "cuda grouped");
    LOOM_CHECK(p.batch == 1, "cuda grouped_gemm: problems are single products, got batch ", p.batch);
    LOOM_CHECK(p.ab_type == problems[0].ab_type && p.c_type == problems[0].c_type,
               "cuda grouped_gemm: the problems must share one type pair");
  }
  if (problems.empty()) return;
  if (variant == GroupedGemmVariant::kSm90Tma) variant = GroupedGemmVariant::kAuto;  // row-grouped only, in ops::
  if (variant == GroupedGemmVariant::kAuto) {
    variant = choose_grouped_gemm(problems, c.sm_count);
    if (is_sm90(variant) && !sm90_grouped_gemm_ready())  // not an sm_90a GPU or build
      variant = cublas_grouped_unsupported(problems) ? GroupedGemmVariant::kLoop : GroupedGemmVariant::kCublasGrouped;
  }
  if (is_sm90(variant)) {
    sm90_grouped_gemm(problems, c.sm_count, pointers, s, nullptr, sm90_tile_n(variant));
    return;
  }
  if (variant == GroupedGemmVariant::kCublasGrouped) {
    const char* why = cublas_grouped_unsupported(problems);
    LOOM_CHECK(why == nullptr, "cuda grouped_gemm: cublasGemmGroupedBatchedEx cannot run these problems: ", why);
    run_cublas_grouped(problems, c, pointers, s);
    return;
  }
  for (const GemmArgs& p : problems) gemm(p, c.cublaslt, c.ws, s);
}

void grouped_gemm_dual(const std::vector<GemmArgs>& problems, const std::vector<GemmArgs>& second,
                       GroupedGemmVariant variant, const GroupedGemmContext& c, void** pointers, Stream s) {
  LOOM_CHECK(second.size() == problems.size(), "cuda grouped_gemm_dual: ", problems.size(), " problems but ",
             second.size(), " second products");
  if (problems.empty()) return;
  if (variant == GroupedGemmVariant::kSm90Tma) variant = GroupedGemmVariant::kAuto;  // row-grouped only, in ops::
  const GroupedGemmVariant pick = variant == GroupedGemmVariant::kAuto ? choose_grouped_gemm(problems, c.sm_count) : variant;
  if (is_sm90(pick) && sm90_grouped_gemm_ready() && sm90_dual_unsupported(problems, second) == nullptr) {
    for (const GemmArgs& p : problems) check_gemm_args(p, "cuda grouped");
    for (const GemmArgs& p : second) check_gemm_args(p, "cuda grouped");
    sm90_grouped_gemm(problems, c.sm_count, pointers, s, &second, sm90_tile_n(pick));
    return;
  }
  // In stream order: the second call's pointer arrays overwrite the first's after it has run. A
  // variant named for the pair names the second's too (a Hopper variant that could not fuse: the rule's).
  grouped_gemm(problems, variant, c, pointers, s);
  grouped_gemm(second_accumulating(problems, second),
               is_sm90(variant) ? GroupedGemmVariant::kAuto : variant, c, pointers, s);
}

}  // namespace loom::cuda
