// Grouped GEMMs (kernels/grouped_gemm.h): the per-expert problem lists both backends run, the rule
// that picks the CUDA variant, and the CPU reference (cpu::gemm per problem).
#include "kernels/grouped_gemm.h"

#include <cstdint>

namespace loom {
namespace {

// Element `elems` of an operand at p; a null operand stays null.
const char* at(const void* p, int64_t elems, GemmType t) {
  if (p == nullptr) return nullptr;
  return static_cast<const char*>(p) + elems * static_cast<int64_t>(gemm_type_size(t));
}

}  // namespace

void check_group_offsets(const char* op, const std::vector<int64_t>& offsets, int64_t rows) {
  LOOM_CHECK(offsets.size() >= 2, op, ": offsets need E + 1 >= 2 entries, got ", offsets.size());
  LOOM_CHECK(offsets.front() == 0 && offsets.back() == rows, op, ": offsets must run from 0 to the ", rows,
             " rows, got ", offsets.front(), " to ", offsets.back());
  for (size_t e = 0; e + 1 < offsets.size(); ++e)
    LOOM_CHECK(offsets[e] <= offsets[e + 1], op, ": offsets must not decrease: expert ", e, " has [", offsets[e],
               ", ", offsets[e + 1], ")");
}

std::vector<GemmArgs> row_grouped_problems(const RowGroupedGemm& g, const std::vector<int64_t>& offsets) {
  std::vector<GemmArgs> out;
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;
    GemmArgs p;
    // C[rows_e] [n_e, m] = A[rows_e] [n_e, k] x op(B[e]), B[e] stored [k, m] or [m, k] (trans_b).
    p.m = rows, p.n = g.m, p.k = g.k;
    p.trans_b = g.trans_b;
    p.a = at(g.a, offsets[e] * g.lda, g.ab_type), p.lda = g.lda;
    p.b = at(g.b, e * g.k * g.m, g.ab_type), p.ldb = g.trans_b ? g.k : g.m;
    p.c = const_cast<char*>(at(g.c, offsets[e] * g.m, g.c_type)), p.ldc = g.m;
    p.ab_type = g.ab_type, p.c_type = g.c_type;
    p.alpha = g.alpha, p.beta = g.beta;
    out.push_back(p);
  }
  return out;
}

std::vector<GemmArgs> reduction_grouped_problems(const ReductionGroupedGemm& g, const std::vector<int64_t>& offsets) {
  std::vector<GemmArgs> out;
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;
    GemmArgs p;
    // C[e] [m, k] = A[rows_e]^T x B[rows_e], A[rows_e] stored [n_e, m], B[rows_e] stored [n_e, k].
    p.m = g.m, p.n = g.k, p.k = rows;
    p.trans_a = true;
    p.a = at(g.a, offsets[e] * g.lda, g.ab_type), p.lda = g.lda;
    p.b = at(g.b, offsets[e] * g.ldb, g.ab_type), p.ldb = g.ldb;
    p.c = const_cast<char*>(at(g.c, e * g.m * g.k, g.c_type)), p.ldc = g.k;
    p.ab_type = g.ab_type, p.c_type = g.c_type;
    p.alpha = g.alpha, p.beta = g.beta;
    out.push_back(p);
  }
  return out;
}

std::vector<GemmArgs> second_accumulating(const std::vector<GemmArgs>& problems, const std::vector<GemmArgs>& second) {
  std::vector<GemmArgs> out = second;
  for (size_t i = 0; i < out.size() && i < problems.size(); ++i) {
    out[i].alpha = problems[i].alpha;
    out[i].beta = 1.f;
  }
  return out;
}

const char* grouped_gemm_variant_name(GroupedGemmVariant v) {
  switch (v) {
    case GroupedGemmVariant::kAuto: return "auto";
    case GroupedGemmVariant::kCublasGrouped: return "cublas_grouped";
    case GroupedGemmVariant::kLoop: return "loop";
    case GroupedGemmVariant::kSm90: return "sm90";
    case GroupedGemmVariant::kSm90Wide: return "sm90_wide";
    case GroupedGemmVariant::kSm90Tma: return "sm90_tma";
  }
  return "?";
}

const char* cublas_grouped_unsupported(const std::vector<GemmArgs>& problems) {
  for (const GemmArgs& p : problems) {
    if (p.ab_type != problems[0].ab_type || p.c_type != problems[0].c_type) return "problems of different types";
    if (p.batch != 1) return "a batched problem";
    // The types cuBLAS lists for cublasGemmGroupedBatchedEx with CUBLAS_COMPUTE_32F and f32 scales.
    const bool same = p.ab_type == p.c_type;
    if (!same || p.ab_type == GemmType::kF64) return "its type pairs are f32->f32 and bf16->bf16 only";
    // The documented alignment for 16-bit types: 16 bytes is always enough.
    for (const void* q : {p.a, p.b, static_cast<const void*>(p.c)})
      if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return "a pointer not 16-byte aligned";
  }
  return nullptr;
}

const char* sm90_grouped_unsupported(const std::vector<GemmArgs>& problems) {
  constexpr int64_t kMax = int64_t(1) << 30;  // the kernel's 32-bit sizes and tile indices
  auto misaligned = [](const void* q, size_t bytes) { return reinterpret_cast<uintptr_t>(q) % bytes != 0; };
  for (const GemmArgs& p : problems) {
    const GemmArgs& p0 = problems[0];
    if (p.ab_type != p0.ab_type || p.c_type != p0.c_type) return "problems of different types";
    if (p.ab_type != GemmType::kBF16 || p.c_type == GemmType::kF64) return "its type pairs are bf16->bf16 and bf16->f32 only";
    if (p.batch != 1) return "a batched problem";
    if (p.trans_a != p0.trans_a || p.trans_b != p0.trans_b) return "problems with different transposes";
    if (p.alpha != p0.alpha || p.beta != p0.beta) return "problems with different alpha or beta";
    for (int64_t v : {p.m, p.n, p.k, p.lda, p.ldb, p.ldc})
      if (v >= kMax) return "a size or leading dimension of 2^30 or more";
    if (((p.m + 127) / 128) * ((p.n + 127) / 128) >= kMax) return "a problem of 2^30 tiles or more";
    // 16-byte cp.async chunks of A and B rows: aligned starts, and rows that end on a whole chunk.
    if (misaligned(p.a, 16) || misaligned(p.b, 16)) return "an A or B pointer not 16-byte aligned";
    if (p.lda % 8 != 0 || p.ldb % 8 != 0) return "an lda or ldb not a multiple of 8";
    if ((p.trans_a ? p.m : p.k) % 8 != 0) return "A's contiguous dimension not a multiple of 8";
    if ((p.trans_b ? p.k : p.n) % 8 != 0) return "B's contiguous dimension not a multiple of 8";
    // Pairs of columns stored at once.
    if (misaligned(p.c, 2 * gemm_type_size(p.c_type)) || p.ldc % 2 != 0 || p.n % 2 != 0)
      return "C not aligned to two elements, or an odd ldc or n";
  }
  return nullptr;
}

const char* sm90_dual_unsupported(const std::vector<GemmArgs>& problems, const std::vector<GemmArgs>& second) {
  if (second.size() != problems.size()) return "a second list of another length";
  if (const char* why = sm90_grouped_unsupported(problems)) return why;
  if (const char* why = sm90_grouped_unsupported(second)) return why;
  for (size_t i = 0; i < problems.size(); ++i) {
    const GemmArgs &p = problems[i], &q = second[i];
    if (q.m != p.m || q.n != p.n || q.c != p.c || q.ldc != p.ldc || q.trans_a != p.trans_a || q.trans_b != p.trans_b ||
        q.ab_type != p.ab_type || q.c_type != p.c_type)
      return "a second product with another output, shape, transpose or type";
  }
  return nullptr;
}

// Provisional, from the arithmetic of tiles; bench/bench_grouped_gemm.cpp times both variants on
// the H200 to settle kGroupedBelowWaves. One cuBLASLt call fills the GPU only when its output has
// enough tiles: Qwen3-30B-A3B's gate_up product averages 512 rows per expert, and 512 x 1536 is 48
// tiles of 128 x 128, a third of an H200's 132 SMs, with its 128 experts running one after another;
// one grouped launch shares all their tiles out at once. Mixtral's 2048 x 28672 per expert is 27
// waves on its own: the loop keeps cuBLASLt's per-shape algorithms and loses little to waves.
GroupedGemmVariant choose_grouped_gemm(const std::vector<GemmArgs>& problems, int sm_count) {
  constexpr double kGroupedBelowWaves = 2.0;  // the average problem's tiles, in waves of sm_count
  constexpr int64_t kTile = 128;
  if (problems.size() < 2 || sm_count <= 0) return GroupedGemmVariant::kLoop;
  double tiles = 0;
  for (const GemmArgs& p : problems)
    tiles += double((p.m + kTile - 1) / kTile) * double((p.n + kTile - 1) / kTile);
  const double waves = tiles / double(problems.size()) / double(sm_count);
  if (waves >= kGroupedBelowWaves) return GroupedGemmVariant::kLoop;
  // A thin row-grouped product (a LoRA factor's: N or K = rank) wastes most of a 128 x 128 x 64
  // wgmma tile; cuBLAS's grouped call picks smaller tiles. H200, Qwen3-30B-A3B's experts at rank 16
  // (bench_grouped_gemm, session 32), cuBLAS grouped against kSm90: gate_up x A^T 122 us against 147,
  // t B^T 189 / 237, dt A 244 / 280, dy B 98 / 137; down 61 / 89, 246 / 287, 99 / 149, 123 / 164;
  // moe.sh none 89,743 tokens/s against 88,622. The factors' gradients (A transposed, N = rank or
  // M = rank) stay on kSm90: 198 us against 1302.
  const GemmArgs& first = problems[0];
  if (!first.trans_a && (first.n < 64 || first.k < 64))
    return cublas_grouped_unsupported(problems) ? GroupedGemmVariant::kLoop : GroupedGemmVariant::kCublasGrouped;
  if (cublas_grouped_unsupported(problems)) return GroupedGemmVariant::kLoop;
  // Many small bf16 problems: Loom's one-launch Hopper kernel (cuda::grouped_gemm falls back to
  // cuBLAS's grouped call off sm_90a). H200, Qwen3-30B-A3B's 128 experts at 8192 x 8 rows
  // (bench_grouped_gemm, session 31): gate_up fwd 1121 us against cuBLAS grouped's 1516, dgrad 1201
  // against 1542, down fwd 668 against 824, dgrad 597 against 744, down wgrad 723 against 997;
  // only gate_up wgrad is slower (1354 against 1262; the loop's 1195 is best there). bf16 -> f32
  // (LoRA factors' gradients) stays on the loop: not yet measured on the Hopper kernel.
  if (sm90_grouped_unsupported(problems)) return GroupedGemmVariant::kCublasGrouped;
  // 128 x 256 tiles where they pad no more columns than 128 x 128 ones and still give every SM at
  // least two: each k-step then loads 48 KiB of operands for twice the products of 32 KiB. H200,
  // Qwen3-30B-A3B's experts (bench_grouped_gemm, session 33), kSm90Wide against kSm90: gate_up fwd
  // 893 us against 1041, dgrad 937 / 1131, wgrad 1214 / 1355; down 566 / 665, 488 / 558, 674 / 734;
  // the dual products 926 / 1100 and 597 / 703; moe.sh none 153,455 tokens/s against 146,001.
  int64_t narrow_cols = 0, wide_cols = 0;
  double wide_tiles = 0;
  for (const GemmArgs& p : problems) {
    narrow_cols += (p.n + 127) / 128 * 128, wide_cols += (p.n + 255) / 256 * 256;
    wide_tiles += double((p.m + kTile - 1) / kTile) * double((p.n + 255) / 256);
  }
  if (wide_cols <= narrow_cols && wide_tiles >= 2.0 * sm_count) return GroupedGemmVariant::kSm90Wide;
  return GroupedGemmVariant::kSm90;
}

}  // namespace loom

namespace loom::cpu {

void grouped_gemm(const std::vector<GemmArgs>& problems) {
  for (const GemmArgs& p : problems) gemm(p);
}

void grouped_gemm_dual(const std::vector<GemmArgs>& problems, const std::vector<GemmArgs>& second) {
  LOOM_CHECK(second.size() == problems.size(), "cpu grouped_gemm_dual: ", problems.size(), " problems but ",
             second.size(), " second products");
  grouped_gemm(problems);
  grouped_gemm(second_accumulating(problems, second));
}

}  // namespace loom::cpu
