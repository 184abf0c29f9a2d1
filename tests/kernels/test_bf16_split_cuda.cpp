// CUDA bf16 hi/lo split and block sum against the CPU reference, bit for bit.
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

}  // namespace
}  // namespace loom::test
