// bf16 hi/lo splitting against its definition in f64: hi is x rounded to bf16, hi + lo recovers x
// to about 2^-16 relative, parts land in the blocks the pattern names; block_sum adds the blocks.
#include <cmath>

#include "kernels/bf16_split.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

TEST(Bf16Split, PartsAndReconstruction) {
  const int64_t rows = 37, k = 19;
  auto x = random_vec<float>(rows * k, 7);
  x[0] = 0.f;
  x[1] = 1e-30f;     // below bf16's normal range: hi is 0 or a bf16 denormal, lo what is left
  x[2] = 3.0e38f;    // near the top of the range
  std::vector<bf16> out(rows * 3 * k);
  SplitPattern p;
  p.parts[0] = 'h', p.parts[1] = 'l', p.parts[2] = 'h', p.count = 3;
  cpu::bf16_split(x.data(), out.data(), rows, k, p);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      const float v = x[r * k + j];
      const float hi = bf16_to_float(out[(r * 3 + 0) * k + j]), lo = bf16_to_float(out[(r * 3 + 1) * k + j]);
      EXPECT_EQ(hi, bf16_to_float(float_to_bf16(v))) << r << "," << j;
      EXPECT_EQ(bf16_to_float(out[(r * 3 + 2) * k + j]), hi);
      // |x - (hi + lo)| <= half an ulp of lo's bf16 rounding: 2^-9 |lo| <= 2^-17 |x|.
      EXPECT_LE(std::abs(double(v) - (double(hi) + double(lo))), std::ldexp(std::abs(double(v)), -16) + 1e-44)
          << v;
    }
}

TEST(Bf16Split, BlockSumAddsTheBlocks) {
  const int64_t rows = 5, k = 11;
  const int m = 3;
  auto in = random_vec<float>(rows * m * k, 8);
  std::vector<float> out(rows * k);
  cpu::block_sum(in.data(), out.data(), rows, k, m, 0.5f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      double s = 0;
      for (int b = 0; b < m; ++b) s += in[(r * m + b) * k + j];
      EXPECT_NEAR(out[r * k + j], 0.5 * s, 1e-6) << r << "," << j;
    }
}

SplitPattern pattern_of(const char* s) {
  SplitPattern p;
  for (; *s; ++s) p.parts[p.count++] = *s;
  return p;
}

// The fused pass writes what block_sum followed by bf16_split writes, bit for bit, for one pattern
// and for two (the alpha chosen so that alpha * sum rounds).
TEST(Bf16Split, BlockSumSplitEqualsBlockSumThenSplit) {
  const int64_t rows = 7, k = 13;
  for (int m : {1, 2, 3}) {
    const auto in = random_vec<float>(rows * m * k, 20 + m);
    std::vector<float> sum(rows * k);
    cpu::block_sum(in.data(), sum.data(), rows, k, m, 0.3f);
    const SplitPattern a = pattern_of("hlh"), b = pattern_of("hl");
    std::vector<bf16> want_a(rows * 3 * k), want_b(rows * 2 * k), got_a(want_a.size()), got_b(want_b.size()),
        only_a(want_a.size());
    cpu::bf16_split(sum.data(), want_a.data(), rows, k, a);
    cpu::bf16_split(sum.data(), want_b.data(), rows, k, b);
    cpu::block_sum_split(in.data(), rows, k, m, 0.3f, got_a.data(), a, got_b.data(), b);
    cpu::block_sum_split(in.data(), rows, k, m, 0.3f, only_a.data(), a, nullptr, SplitPattern{});
    EXPECT_EQ(rel_error(got_a, want_a), 0.0) << m;
    EXPECT_EQ(rel_error(got_b, want_b), 0.0) << m;
    EXPECT_EQ(rel_error(only_a, want_a), 0.0) << m;
  }
}

// A row pitch wider than the parts (a weight's or an input's spare columns): each row's parts as
// without it, the columns past them untouched.
TEST(Bf16Split, PitchedRowsMatchAndLeaveTheRestAlone) {
  const int64_t rows = 5, k = 7, ld = 3 * k + 5;
  const auto x = random_vec<float>(rows * k, 21);
  const auto in = random_vec<float>(rows * 2 * k, 22);
  SplitPattern p;
  p.parts[0] = 'h', p.parts[1] = 'h', p.parts[2] = 'l', p.count = 3;
  std::vector<bf16> flat(rows * 3 * k), wide(rows * ld, float_to_bf16(-7.f)), sum_flat(rows * 3 * k),
      sum_wide(rows * ld, float_to_bf16(-7.f));
  cpu::bf16_split(x.data(), flat.data(), rows, k, p);
  cpu::bf16_split(x.data(), wide.data(), rows, k, p, ld);
  cpu::block_sum_split(in.data(), rows, k, 2, 0.5f, sum_flat.data(), p, nullptr, SplitPattern{});
  cpu::block_sum_split(in.data(), rows, k, 2, 0.5f, sum_wide.data(), p, nullptr, SplitPattern{}, ld);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < ld; ++c) {
      const float want = c < 3 * k ? bf16_to_float(flat[r * 3 * k + c]) : -7.f;
      const float want_sum = c < 3 * k ? bf16_to_float(sum_flat[r * 3 * k + c]) : -7.f;
      EXPECT_EQ(bf16_to_float(wide[r * ld + c]), want) << r << "," << c;
      EXPECT_EQ(bf16_to_float(sum_wide[r * ld + c]), want_sum) << r << "," << c;
    }
}

// One adapter's column block of a product for several (ag::lora_linears): in's rows ld_in apart, both
// patterns written into rows of their own pitch; the same bits as the unpitched call on a copy of
// the block, and nothing outside the block's columns written.
TEST(Bf16Split, BlockSumReadsAColumnBlockAndWritesBothPatternsPitched) {
  const int64_t rows = 6, k = 5, ld_in = 4 * k + 3, col = 2 * k + 1, ld_a = 2 * k + 4, ld_b = 3 * k + 9;
  const auto wide_in = random_vec<float>(rows * ld_in, 23);
  std::vector<float> block(rows * 2 * k);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < 2 * k; ++c) block[r * 2 * k + c] = wide_in[r * ld_in + col + c];
  SplitPattern hl, hlh;
  for (char c : {'h', 'l'}) hl.parts[hl.count++] = c;
  for (char c : {'h', 'l', 'h'}) hlh.parts[hlh.count++] = c;
  std::vector<bf16> ref_a(rows * 2 * k), ref_b(rows * 3 * k), a(rows * ld_a, float_to_bf16(-7.f)),
      b(rows * ld_b, float_to_bf16(-7.f));
  cpu::block_sum_split(block.data(), rows, k, 2, 0.75f, ref_a.data(), hl, ref_b.data(), hlh);
  cpu::block_sum_split(wide_in.data() + col, rows, k, 2, 0.75f, a.data(), hl, b.data(), hlh, ld_a, ld_b, ld_in);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < ld_a; ++c)
      EXPECT_EQ(bf16_to_float(a[r * ld_a + c]), c < 2 * k ? bf16_to_float(ref_a[r * 2 * k + c]) : -7.f) << r << "," << c;
    for (int64_t c = 0; c < ld_b; ++c)
      EXPECT_EQ(bf16_to_float(b[r * ld_b + c]), c < 3 * k ? bf16_to_float(ref_b[r * 3 * k + c]) : -7.f) << r << "," << c;
  }
}

// Jobs of every kind the LoRA products batch (A stacked as one row, B along its columns, s B into a
// pitched view) and a few more (two blocks, two patterns, an empty job): the batch writes the bits each
// job's block_sum_split writes alone, and nothing beside its columns. (On the CPU the batch is that loop:
// this checks how each job's fields reach it; the CUDA kernel's own test is Bf16SplitCuda.BatchMatchesCpuExactly.)
TEST(Bf16Split, BatchEqualsEachJobAlone) {
  struct Case {
    int64_t rows, k;
    int m;
    float alpha;
    const char *a, *b;
    int64_t pad_a, pad_b;
  };
  const std::vector<Case> cases = {{1, 48, 1, 1.f, "hhl", "hl", 0, 0}, {40, 4, 1, 1.f, "hhlh", nullptr, 0, 0},
                                   {40, 4, 1, 2.f, "hhl", nullptr, 29, 0}, {0, 4, 1, 1.f, "hl", nullptr, 0, 0},
                                   {7, 5, 2, 0.5f, "hlh", "hl", 3, 1},      {3, 9, 3, -1.25f, "l", "hhhh", 0, 2}};
  auto pattern = [](const char* s) {
    SplitPattern p;
    for (; s && *s; ++s) p.parts[p.count++] = *s;
    return p;
  };
  std::vector<std::vector<float>> ins;
  std::vector<std::vector<bf16>> outs_a, outs_b, refs_a, refs_b;
  std::vector<SplitJob> jobs;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SplitJob j;
    j.a = pattern(c.a), j.b = pattern(c.b);
    ins.push_back(random_vec<float>(std::max<int64_t>(1, c.rows * c.m * c.k), 31 + static_cast<uint32_t>(i)));
    j.rows = c.rows, j.k = c.k, j.m = c.m, j.alpha = c.alpha, j.ldi = c.m * c.k;
    j.lda = j.a.count * c.k + c.pad_a, j.ldb = j.b.count * c.k + c.pad_b;
    outs_a.emplace_back(std::max<int64_t>(1, c.rows * j.lda), float_to_bf16(-7.f));
    outs_b.emplace_back(std::max<int64_t>(1, c.rows * j.ldb), float_to_bf16(-7.f));
    refs_a.push_back(outs_a.back()), refs_b.push_back(outs_b.back());
    jobs.push_back(j);
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    SplitJob& j = jobs[i];
    j.in = ins[i].data(), j.out_a = outs_a[i].data(), j.out_b = cases[i].b ? outs_b[i].data() : nullptr;
    cpu::block_sum_split(j.in, j.rows, j.k, j.m, j.alpha, refs_a[i].data(), j.a, j.out_b ? refs_b[i].data() : nullptr,
                         j.b, j.lda, j.ldb, j.ldi);
  }
  cpu::block_sum_split_batch(jobs.data(), static_cast<int>(jobs.size()));
  for (size_t i = 0; i < jobs.size(); ++i) {
    for (size_t e = 0; e < outs_a[i].size(); ++e) EXPECT_EQ(outs_a[i][e].bits, refs_a[i][e].bits) << "job " << i << " a " << e;
    for (size_t e = 0; e < outs_b[i].size(); ++e) EXPECT_EQ(outs_b[i][e].bits, refs_b[i][e].bits) << "job " << i << " b " << e;
  }
}

// One block, alpha 1: block_sum_split gives bf16_split's bits, -0 included (the LoRA products' splits
// of A and B moved from bf16_split to the batch of block_sum_split jobs).
TEST(Bf16Split, OneBlockSplitIsBf16Split) {
  const int64_t rows = 5, k = 12;
  auto x = random_vec<float>(rows * k, 41);
  x[3] = -0.f, x[7] = 0.f;
  SplitPattern p;
  for (char c : {'h', 'h', 'l', 'h'}) p.parts[p.count++] = c;
  std::vector<bf16> ref(rows * 4 * k), got(rows * 4 * k);
  cpu::bf16_split(x.data(), ref.data(), rows, k, p);
  cpu::block_sum_split(x.data(), rows, k, 1, 1.f, got.data(), p, nullptr, SplitPattern{});
  for (size_t e = 0; e < ref.size(); ++e) EXPECT_EQ(got[e].bits, ref[e].bits) << e;
  EXPECT_TRUE(std::signbit(bf16_to_float(got[3]))) << "-0's hi part";
}

}  // namespace
}  // namespace loom::test
