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

}  // namespace
}  // namespace loom::test
