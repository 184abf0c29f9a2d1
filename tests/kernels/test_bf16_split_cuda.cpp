// CUDA bf16 hi/lo split and block sum against the CPU reference, bit for bit.
#include <memory>
#include <vector>

#include "kernels/bf16_split.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

TEST(Bf16SplitCuda, MatchesCpuExactly) {
  LOOM_REQUIRE_GPU();
  for (auto [rows, k] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 16}, {16384, 16}, {1, 16 * 4096}}) {
    auto x = random_vec<float>(rows * k, 9 + k);
    for (const char* pattern : {"hl", "hlh", "hhl"}) {
      SplitPattern p;
      for (const char* c = pattern; *c; ++c) p.parts[p.count++] = *c;
      std::vector<bf16> ref(rows * p.count * k);
      cpu::bf16_split(x.data(), ref.data(), rows, k, p);
      DeviceBuffer<float> d_x(x);
      DeviceBuffer<bf16> d_out(ref.size());
      cuda::bf16_split(d_x.get(), d_out.get(), rows, k, p, nullptr);
      EXPECT_EQ(rel_error(d_out.to_host(), ref), 0.0) << rows << "x" << k << " " << pattern;
    }
    std::vector<float> ref(rows * k / 1);
    auto in = random_vec<float>(rows * 2 * k, 10 + k);
    cpu::block_sum(in.data(), ref.data(), rows, k, 2, 0.25f);
    DeviceBuffer<float> d_in(in), d_sum(rows * k);
    cuda::block_sum(d_in.get(), d_sum.get(), rows, k, 2, 0.25f, nullptr);
    EXPECT_EQ(rel_error(d_sum.to_host(), ref), 0.0) << rows << "x" << k;  // the same two adds, same order
  }
}

// The fused block sum + split against the CPU's, bit for bit (two patterns and one).
TEST(Bf16SplitCuda, BlockSumSplitMatchesCpuExactly) {
  LOOM_REQUIRE_GPU();
  SplitPattern a, b;
  for (char c : {'h', 'l', 'h'}) a.parts[a.count++] = c;
  for (char c : {'h', 'l'}) b.parts[b.count++] = c;
  for (auto [rows, k] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 16}, {16384, 16}}) {
    const auto in = random_vec<float>(rows * 2 * k, 30 + k);
    std::vector<bf16> ref_a(rows * 3 * k), ref_b(rows * 2 * k);
    cpu::block_sum_split(in.data(), rows, k, 2, 0.3f, ref_a.data(), a, ref_b.data(), b);
    DeviceBuffer<float> d_in(in);
    DeviceBuffer<bf16> d_a(ref_a.size()), d_b(ref_b.size()), d_only(ref_a.size());
    cuda::block_sum_split(d_in.get(), rows, k, 2, 0.3f, d_a.get(), a, d_b.get(), b, nullptr);
    cuda::block_sum_split(d_in.get(), rows, k, 2, 0.3f, d_only.get(), a, nullptr, SplitPattern{}, nullptr);
    EXPECT_EQ(rel_error(d_a.to_host(), ref_a), 0.0) << rows << "x" << k;
    EXPECT_EQ(rel_error(d_b.to_host(), ref_b), 0.0) << rows << "x" << k;
    EXPECT_EQ(rel_error(d_only.to_host(), ref_a), 0.0) << rows << "x" << k;
  }
}

// Written into rows a pitch apart (spare columns), as the CPU writes them, the gaps untouched.
TEST(Bf16SplitCuda, PitchedRowsMatchCpu) {
  LOOM_REQUIRE_GPU();
  SplitPattern p;
  for (char c : {'h', 'h', 'l'}) p.parts[p.count++] = c;
  const int64_t rows = 16384, k = 16, ld = 2048 + 3 * k + 8;
  const auto x = random_vec<float>(rows * k, 41), in = random_vec<float>(rows * 2 * k, 42);
  std::vector<bf16> ref(rows * ld, float_to_bf16(-7.f)), ref_sum(rows * ld, float_to_bf16(-7.f));
  cpu::bf16_split(x.data(), ref.data(), rows, k, p, ld);
  cpu::block_sum_split(in.data(), rows, k, 2, 0.3f, ref_sum.data(), p, nullptr, SplitPattern{}, ld);
  DeviceBuffer<float> d_x(x), d_in(in);
  DeviceBuffer<bf16> d_out(std::vector<bf16>(rows * ld, float_to_bf16(-7.f))),
      d_sum(std::vector<bf16>(rows * ld, float_to_bf16(-7.f)));
  cuda::bf16_split(d_x.get(), d_out.get(), rows, k, p, nullptr, ld);
  cuda::block_sum_split(d_in.get(), rows, k, 2, 0.3f, d_sum.get(), p, nullptr, SplitPattern{}, nullptr, ld);
  EXPECT_EQ(rel_error(d_out.to_host(), ref), 0.0);
  EXPECT_EQ(rel_error(d_sum.to_host(), ref_sum), 0.0);
}

// The pitched input and both pitched outputs of ag::lora_linears (a [rows, 2r] block of a [rows, 6r]
// product; dt's parts into their columns of [rows, 6r] and [rows, 9r]): the CPU kernel's bits.
TEST(Bf16SplitCuda, BlockSumPitchedInputAndOutputsMatchCpu) {
  LOOM_REQUIRE_GPU();
  SplitPattern hl, hlh;
  for (char c : {'h', 'l'}) hl.parts[hl.count++] = c;
  for (char c : {'h', 'l', 'h'}) hlh.parts[hlh.count++] = c;
  const int64_t rows = 16384, k = 16, ld_in = 6 * k, col = 2 * k, ld_a = 6 * k, ld_b = 9 * k;
  const auto in = random_vec<float>(rows * ld_in, 43);
  std::vector<bf16> ref_a(rows * ld_a, float_to_bf16(-7.f)), ref_b(rows * ld_b, float_to_bf16(-7.f));
  cpu::block_sum_split(in.data() + col, rows, k, 2, 1.f, ref_a.data() + 2 * k, hl, ref_b.data() + 3 * k, hlh, ld_a, ld_b,
                       ld_in);
  DeviceBuffer<float> d_in(in);
  DeviceBuffer<bf16> d_a(std::vector<bf16>(rows * ld_a, float_to_bf16(-7.f))),
      d_b(std::vector<bf16>(rows * ld_b, float_to_bf16(-7.f)));
  cuda::block_sum_split(d_in.get() + col, rows, k, 2, 1.f, d_a.get() + 2 * k, hl, d_b.get() + 3 * k, hlh, nullptr, ld_a,
                        ld_b, ld_in);
  EXPECT_EQ(rel_error(d_a.to_host(), ref_a), 0.0);
  EXPECT_EQ(rel_error(d_b.to_host(), ref_b), 0.0);
}

// The batch on CUDA against the CPU's jobs, bit for bit: 15 jobs (two launches of at most 12), an
// empty one among them, the LoRA products' kinds (A stacked as one row with two patterns, B along its
// columns, s B into pitched rows) at the 8B shape's sizes and small odd ones; sentinels beside the
// pitched rows stay.
TEST(Bf16SplitCuda, BatchMatchesCpuExactly) {
  LOOM_REQUIRE_GPU();
  struct Case {
    int64_t rows, k;
    int m;
    float alpha;
    const char *a, *b;
    int64_t pad_a;
  };
  std::vector<Case> cases;
  for (int i = 0; i < 5; ++i) {
    cases.push_back({1, 16 * 4096, 1, 1.f, "hhl", "hl", 0});   // A [16, 4096] stacked
    cases.push_back({14336, 16, 1, 1.f, "hhlh", nullptr, 0});  // B [14336, 16] along its columns
    cases.push_back({i == 2 ? 0 : 37, 5, 1 + i % 2, 2.f, "hhl", i % 2 ? "l" : nullptr, 4160 - 15});  // s B beside W
  }
  auto pattern = [](const char* s) {
    SplitPattern p;
    for (; s && *s; ++s) p.parts[p.count++] = *s;
    return p;
  };
  std::vector<SplitJob> cpu_jobs, gpu_jobs;
  std::vector<std::vector<bf16>> ref_a, ref_b;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> d_in;
  std::vector<std::unique_ptr<DeviceBuffer<bf16>>> d_a, d_b;
  std::vector<std::vector<float>> ins;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SplitJob j;
    j.a = pattern(c.a), j.b = pattern(c.b);
    j.rows = c.rows, j.k = c.k, j.m = c.m, j.alpha = c.alpha, j.ldi = c.m * c.k;
    j.lda = j.a.count * c.k + c.pad_a, j.ldb = j.b.count * c.k;
    ins.push_back(random_vec<float>(std::max<int64_t>(1, c.rows * c.m * c.k), 50 + static_cast<uint32_t>(i)));
    ref_a.emplace_back(std::max<int64_t>(1, c.rows * j.lda), float_to_bf16(-7.f));
    ref_b.emplace_back(std::max<int64_t>(1, c.rows * j.ldb), float_to_bf16(-7.f));
    d_in.push_back(std::make_unique<DeviceBuffer<float>>(ins.back()));
    d_a.push_back(std::make_unique<DeviceBuffer<bf16>>(ref_a.back()));
    d_b.push_back(std::make_unique<DeviceBuffer<bf16>>(ref_b.back()));
    SplitJob cj = j, gj = j;
    cj.in = ins.back().data(), cj.out_a = ref_a.back().data(), cj.out_b = c.b ? ref_b.back().data() : nullptr;
    gj.in = d_in.back()->get(), gj.out_a = d_a.back()->get(), gj.out_b = c.b ? d_b.back()->get() : nullptr;
    cpu_jobs.push_back(cj), gpu_jobs.push_back(gj);
  }
  cpu::block_sum_split_batch(cpu_jobs.data(), static_cast<int>(cpu_jobs.size()));
  cuda::block_sum_split_batch(gpu_jobs.data(), static_cast<int>(gpu_jobs.size()), nullptr);
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<bf16> a = d_a[i]->to_host(), b = d_b[i]->to_host();
    size_t wrong = 0;
    for (size_t e = 0; e < a.size(); ++e) wrong += a[e].bits != ref_a[i][e].bits;
    for (size_t e = 0; e < b.size(); ++e) wrong += b[e].bits != ref_b[i][e].bits;
    EXPECT_EQ(wrong, 0u) << "job " << i;
  }
}

}  // namespace
}  // namespace loom::test
