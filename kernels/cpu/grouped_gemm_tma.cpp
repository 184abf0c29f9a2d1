// What the TMA-fed Hopper grouped GEMM (kernels/grouped_gemm_tma.h) can run: checked on the host, so
// the rule is the same with or without a GPU (and tested without one).
#include "kernels/grouped_gemm_tma.h"

#include <cstdint>

namespace loom {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// One operand list's own conditions (tensor maps of A [N, k] and B [E, m, k] or [E, k, m]).
const char* unsupported_one(const RowGroupedGemm& g, int64_t rows) {
  constexpr int64_t kMax = int64_t(1) << 31;
  if (g.a == nullptr || g.b == nullptr) return "a null A or B";
  if (g.ab_type != GemmType::kBF16) return "its A and B are not bf16";
  if (g.c_type != GemmType::kBF16 && g.c_type != GemmType::kF32) return "its C is neither bf16 nor f32";
  if (g.k < 1 || g.m < 1) return "an empty reduction or output width";
  if (g.k % 8 != 0 || g.lda % 8 != 0 || g.m % 8 != 0) return "K, lda or the output width not a multiple of 8";
  if (g.lda < g.k) return "lda below K";
  if (!aligned16(g.a) || !aligned16(g.b)) return "an A or B pointer not 16-byte aligned";
  for (int64_t v : {g.k, g.m, g.lda})
    if (v >= kMax) return "a size or leading dimension of 2^31 or more";
  if (rows >= kMax - 256) return "2^31 - 256 rows or more (a tile's first row past the last must fit an int)";
  return nullptr;
}

}  // namespace

namespace {
const char* unsupported(const RowGroupedGemm& g, const RowGroupedGemm* second, const std::vector<int64_t>& offsets) {
  if (offsets.size() < 2) return "no experts";
  if (int64_t(offsets.size()) - 1 > kSm90TmaMaxExperts) return "more experts than the kernel's launch arguments hold";
  const int64_t rows = offsets.back();
  if (const char* why = unsupported_one(g, rows)) return why;
  if (g.c == nullptr || reinterpret_cast<uintptr_t>(g.c) % (2 * (g.c_type == GemmType::kF32 ? 4 : 2)) != 0)
    return "C not aligned to a pair of elements";
  if (second != nullptr) {
    if (const char* why = unsupported_one(*second, rows)) return why;
    if (second->trans_b != g.trans_b || second->m != g.m || second->c != g.c || second->c_type != g.c_type ||
        second->alpha != g.alpha || second->beta != g.beta)
      return "a second product that does not share the first's transposes, width, C, types, alpha and beta";
  }
  return nullptr;
}
}  // namespace

const char* sm90_tma_unsupported(const RowGroupedGemm& g, const RowGroupedGemm* second,
                                 const std::vector<int64_t>& offsets) {
  return unsupported(g, second, offsets);
}

}  // namespace loom
