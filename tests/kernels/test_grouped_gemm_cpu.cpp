// The grouped-GEMM problem lists (kernels/grouped_gemm.h): each expert's pointers, sizes and leading
// dimensions written out by hand for a small case; and the rule that picks the CUDA variant, on the
// MoE shapes it was written for (plain host code: no GPU needed).
#include <gtest/gtest.h>

#include <vector>

#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_tma.h"

namespace loom::test {
namespace {

const char* base(uintptr_t at) { return reinterpret_cast<const char*>(at); }

TEST(GroupedGemmProblems, RowGroupedPerExpert) {
  // 3 experts, rows {2, 0, 3}; A [5, k=4] with row stride 6, bf16 (2 bytes); B [3, m=8, k=4] (trans_b);
  // C [5, 8] f32 (4 bytes).
  RowGroupedGemm g;
  g.a = base(0x1000), g.lda = 6, g.b = base(0x2000), g.c = const_cast<char*>(base(0x3000));
  g.k = 4, g.m = 8, g.trans_b = true;
  g.ab_type = GemmType::kBF16, g.c_type = GemmType::kF32;
  g.alpha = 2.f, g.beta = 1.f;
  const std::vector<GemmArgs> p = row_grouped_problems(g, {0, 2, 2, 5});
  ASSERT_EQ(p.size(), 2u);  // the expert without rows has no problem
  EXPECT_EQ(p[0].m, 2);
  EXPECT_EQ(p[1].m, 3);
  for (const GemmArgs& q : p) {
    EXPECT_EQ(q.n, 8);
    EXPECT_EQ(q.k, 4);
    EXPECT_TRUE(q.trans_b);
    EXPECT_FALSE(q.trans_a);
    EXPECT_EQ(q.lda, 6);
    EXPECT_EQ(q.ldb, 4);
    EXPECT_EQ(q.ldc, 8);
    EXPECT_EQ(q.alpha, 2.f);
    EXPECT_EQ(q.beta, 1.f);
  }
  EXPECT_EQ(p[0].a, base(0x1000));
  EXPECT_EQ(p[1].a, base(0x1000 + 2 * 6 * 2));  // row 2
  EXPECT_EQ(p[0].b, base(0x2000));
  EXPECT_EQ(p[1].b, base(0x2000 + 2 * 32 * 2));  // expert 2
  EXPECT_EQ(p[0].c, base(0x3000));
  EXPECT_EQ(p[1].c, base(0x3000 + 2 * 8 * 4));  // row 2
  g.trans_b = false;
  EXPECT_EQ(row_grouped_problems(g, {0, 2, 2, 5})[0].ldb, 8);  // B[e] stored [k, m]
}

TEST(GroupedGemmProblems, ReductionGroupedPerExpert) {
  // 3 experts, rows {0, 4, 1}; A [5, m=3] ld 3, B [5, k=7] ld 9, f32; C [3, 3, 7].
  ReductionGroupedGemm g;
  g.a = base(0x1000), g.lda = 3, g.b = base(0x2000), g.ldb = 9, g.c = const_cast<char*>(base(0x3000));
  g.m = 3, g.k = 7;
  const std::vector<GemmArgs> p = reduction_grouped_problems(g, {0, 0, 4, 5});
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].k, 4);
  EXPECT_EQ(p[1].k, 1);
  for (const GemmArgs& q : p) {
    EXPECT_EQ(q.m, 3);
    EXPECT_EQ(q.n, 7);
    EXPECT_TRUE(q.trans_a);
    EXPECT_FALSE(q.trans_b);
    EXPECT_EQ(q.lda, 3);
    EXPECT_EQ(q.ldb, 9);
    EXPECT_EQ(q.ldc, 7);
  }
  EXPECT_EQ(p[0].a, base(0x1000));
  EXPECT_EQ(p[1].a, base(0x1000 + 4 * 3 * 4));
  EXPECT_EQ(p[1].b, base(0x2000 + 4 * 9 * 4));
  EXPECT_EQ(p[0].c, base(0x3000 + 1 * 21 * 4));  // expert 1
  EXPECT_EQ(p[1].c, base(0x3000 + 2 * 21 * 4));
}

TEST(GroupedGemmProblems, OffsetsAreChecked) {
  EXPECT_NO_THROW(check_group_offsets("t", {0, 0, 3}, 3));
  EXPECT_THROW(check_group_offsets("t", {0}, 0), Error);
  EXPECT_THROW(check_group_offsets("t", {1, 3}, 3), Error);
  EXPECT_THROW(check_group_offsets("t", {0, 2}, 3), Error);
  EXPECT_THROW(check_group_offsets("t", {0, 2, 1, 3}, 3), Error);
}

// `count` experts of `rows` rows each, of row-grouped products [rows, k] x [k, m], 256-byte aligned.
std::vector<GemmArgs> experts(int count, int64_t rows, int64_t k, int64_t m, GemmType ab, GemmType c) {
  std::vector<int64_t> offsets{0};
  for (int e = 0; e < count; ++e) offsets.push_back(offsets.back() + rows);
  RowGroupedGemm g;
  g.a = base(0x100000), g.lda = k, g.b = base(0x200000), g.c = const_cast<char*>(base(0x300000));
  g.k = k, g.m = m, g.trans_b = true, g.ab_type = ab, g.c_type = c;
  return row_grouped_problems(g, offsets);
}

// Many small bf16 problems go to Loom's Hopper grouped kernel (cuBLAS's grouped call off sm_90a).
TEST(GroupedGemmRule, GroupedForManySmallExpertsLoopForFewLargeOnes) {
  constexpr int kH200Sms = 132;
  const GemmType bf = GemmType::kBF16;
  // Qwen3-30B-A3B: 128 experts of ~512 rows, gate_up [2048 -> 1536] and down [768 -> 2048]: widths
  // that 256-wide tiles cover without padding, 3,072 and 4,096 of them.
  EXPECT_EQ(choose_grouped_gemm(experts(128, 512, 2048, 1536, bf, bf), kH200Sms), GroupedGemmVariant::kSm90Wide);
  EXPECT_EQ(choose_grouped_gemm(experts(128, 512, 768, 2048, bf, bf), kH200Sms), GroupedGemmVariant::kSm90Wide);
  // A width 256-wide tiles would pad (1408: Qwen1.5-MoE's 2 x 704) or too few tiles for two waves
  // of them keep 128 x 128 tiles.
  EXPECT_EQ(choose_grouped_gemm(experts(128, 512, 2048, 1408, bf, bf), kH200Sms), GroupedGemmVariant::kSm90);
  EXPECT_EQ(choose_grouped_gemm(experts(16, 128, 2048, 1536, bf, bf), kH200Sms), GroupedGemmVariant::kSm90);
  // Mixtral-8x7B: 8 experts of ~2048 rows, gate_up [4096 -> 28672].
  EXPECT_EQ(choose_grouped_gemm(experts(8, 2048, 4096, 28672, bf, bf), kH200Sms), GroupedGemmVariant::kLoop);
  // What cuBLAS's grouped call cannot run goes to the loop: bf16 -> f32, f64, unaligned rows (k = 5).
  EXPECT_EQ(choose_grouped_gemm(experts(128, 512, 2048, 1536, bf, GemmType::kF32), kH200Sms), GroupedGemmVariant::kLoop);
  EXPECT_EQ(choose_grouped_gemm(experts(128, 512, 2048, 1536, GemmType::kF64, GemmType::kF64), kH200Sms),
            GroupedGemmVariant::kLoop);
  EXPECT_NE(cublas_grouped_unsupported(experts(4, 3, 5, 8, bf, bf)), nullptr);
  EXPECT_EQ(choose_grouped_gemm(experts(4, 3, 5, 8, bf, bf), kH200Sms), GroupedGemmVariant::kLoop);
  EXPECT_EQ(cublas_grouped_unsupported(experts(4, 3, 8, 8, bf, bf)), nullptr);
  // Rank-16 LoRA factors' row-grouped products (N or K = 16) go to cuBLAS's grouped call, or the loop
  // for what it cannot run.
  EXPECT_EQ(choose_grouped_gemm(experts(128, 512, 2048, 16, bf, bf), kH200Sms), GroupedGemmVariant::kCublasGrouped);
  EXPECT_EQ(choose_grouped_gemm(experts(128, 512, 16, 1536, bf, bf), kH200Sms), GroupedGemmVariant::kCublasGrouped);
  EXPECT_EQ(choose_grouped_gemm(experts(128, 512, 16, 1536, bf, GemmType::kF32), kH200Sms), GroupedGemmVariant::kLoop);
}

// What the kSm90 kernel takes: bf16 operands (to bf16 or f32) whose rows are whole 16-byte chunks,
// with one transpose pair, alpha and beta for all problems.
TEST(GroupedGemmRule, Sm90KernelSupport) {
  const GemmType bf = GemmType::kBF16, f32 = GemmType::kF32;
  EXPECT_EQ(sm90_grouped_unsupported(experts(128, 500, 2048, 1536, bf, bf)), nullptr);
  EXPECT_EQ(sm90_grouped_unsupported(experts(128, 500, 2048, 1536, bf, f32)), nullptr);
  EXPECT_EQ(sm90_grouped_unsupported(experts(3, 1, 8, 2, bf, bf)), nullptr);  // any row count; n even
  EXPECT_NE(sm90_grouped_unsupported(experts(4, 64, 64, 64, f32, f32)), nullptr);
  EXPECT_NE(sm90_grouped_unsupported(experts(4, 64, 64, 64, GemmType::kF64, GemmType::kF64)), nullptr);
  EXPECT_NE(sm90_grouped_unsupported(experts(4, 3, 5, 8, bf, bf)), nullptr);   // k = 5: rows off 16 bytes
  EXPECT_NE(sm90_grouped_unsupported(experts(4, 3, 8, 7, bf, bf)), nullptr);   // odd n
  std::vector<GemmArgs> p = experts(4, 64, 64, 64, bf, bf);
  p[1].beta = 1.f;
  EXPECT_NE(sm90_grouped_unsupported(p), nullptr);
  p = experts(4, 64, 64, 64, bf, bf);
  p[2].b = base(0x200008);
  EXPECT_NE(sm90_grouped_unsupported(p), nullptr);
  p = experts(4, 64, 64, 64, bf, bf);
  p[0].batch = 2;
  EXPECT_NE(sm90_grouped_unsupported(p), nullptr);
  // A transposed A's contiguous dimension is M, an untransposed B's is N.
  p = experts(2, 64, 64, 64, bf, bf);
  for (GemmArgs& q : p) q.trans_a = true, q.trans_b = false, q.m = 12;
  EXPECT_NE(sm90_grouped_unsupported(p), nullptr);
  for (GemmArgs& q : p) q.m = 16, q.n = 20;
  EXPECT_NE(sm90_grouped_unsupported(p), nullptr);
  for (GemmArgs& q : p) q.n = 24, q.k = 3;  // K (an expert's rows) is free
  EXPECT_EQ(sm90_grouped_unsupported(p), nullptr);
  EXPECT_STREQ(grouped_gemm_variant_name(GroupedGemmVariant::kSm90), "sm90");
  EXPECT_STREQ(grouped_gemm_variant_name(GroupedGemmVariant::kSm90Wide), "sm90_wide");
}

}  // namespace
}  // namespace loom::test

namespace loom::test {
namespace {

// What the TMA-fed Hopper kernel (kernels/grouped_gemm_tma.h) takes: bf16 operands in tensor maps
// (16-byte aligned, row strides and K multiples of 8), a bf16 or f32 C, at most 256 experts, and a
// LoRA term that shares the first product's transposes, width, C, types and scales.
TEST(GroupedGemmRule, Sm90TmaSupport) {
  auto at = [](uintptr_t p) { return reinterpret_cast<const void*>(p); };
  RowGroupedGemm g;
  g.a = at(0x100000), g.lda = 2048, g.b = at(0x200000), g.c = const_cast<void*>(at(0x300000));
  g.k = 2048, g.m = 1536, g.trans_b = true, g.ab_type = GemmType::kBF16, g.c_type = GemmType::kBF16;
  std::vector<int64_t> off(129);
  for (size_t e = 0; e < off.size(); ++e) off[e] = int64_t(e) * 512;
  EXPECT_EQ(sm90_tma_unsupported(g, nullptr, off), nullptr);
  RowGroupedGemm lora = g;  // t [N, 16] x B_e [1536, 16]^T
  lora.a = at(0x400000), lora.lda = 16, lora.b = at(0x500000), lora.k = 16;
  EXPECT_EQ(sm90_tma_unsupported(g, &lora, off), nullptr);
  g.c_type = GemmType::kF32, lora.c_type = GemmType::kF32;
  EXPECT_EQ(sm90_tma_unsupported(g, &lora, off), nullptr);
  RowGroupedGemm bad = g;
  bad.ab_type = GemmType::kF32;
  EXPECT_NE(sm90_tma_unsupported(bad, nullptr, off), nullptr);
  bad = g, bad.k = 2044, bad.lda = 2044;  // rows off 16 bytes
  EXPECT_NE(sm90_tma_unsupported(bad, nullptr, off), nullptr);
  bad = g, bad.m = 1540;
  EXPECT_NE(sm90_tma_unsupported(bad, nullptr, off), nullptr);
  bad = g, bad.b = at(0x200008);
  EXPECT_NE(sm90_tma_unsupported(bad, nullptr, off), nullptr);
  bad = g, bad.b = nullptr;
  EXPECT_NE(sm90_tma_unsupported(bad, nullptr, off), nullptr);
  std::vector<int64_t> huge = {0, (int64_t(1) << 31) - 200};
  EXPECT_NE(sm90_tma_unsupported(g, nullptr, huge), nullptr);
  RowGroupedGemm other = lora;
  other.trans_b = false;
  EXPECT_NE(sm90_tma_unsupported(g, &other, off), nullptr);
  other = lora, other.beta = 1.f;
  EXPECT_NE(sm90_tma_unsupported(g, &other, off), nullptr);
  other = lora, other.k = 20;  // a rank whose rows are not whole 16-byte chunks
  EXPECT_NE(sm90_tma_unsupported(g, &other, off), nullptr);
  std::vector<int64_t> many(258, 0);  // 257 experts
  EXPECT_NE(sm90_tma_unsupported(g, nullptr, many), nullptr);
  EXPECT_NE(sm90_tma_unsupported(g, nullptr, {0}), nullptr);
}

}  // namespace
}  // namespace loom::test
