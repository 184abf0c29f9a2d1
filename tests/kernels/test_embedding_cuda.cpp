// CUDA embedding against the CPU reference: exact gathers for odd and packed widths, scatter-add
// with repeated ids, and ids outside [0, vocab) giving zero rows / being skipped.
#include <climits>

#include "kernels/embedding.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

template <class T>
class EmbeddingCuda : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(EmbeddingCuda, Types);

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, int32_t(vocab - 1));
  std::vector<int32_t> ids(n);
  for (auto& v : ids) v = dist(gen);
  return ids;
}

// (n, vocab, dim): dims below 32 take the thread-per-element path (dim 1 as a MoE layer's routing
// weight per row), 4099 the scalar one, 32, 64 and 4096 the 16-byte one.
const std::vector<std::tuple<int64_t, int64_t, int64_t>> kShapes = {
    {1, 1, 1}, {5, 3, 7}, {2048, 2048, 1}, {1000, 40, 31}, {1000, 40, 32},
    {300, 1000, 64}, {77, 50, 4099}, {513, 5000, 4096}};

TYPED_TEST(EmbeddingCuda, ForwardMatchesCpuExactly) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  for (auto [n, vocab, dim] : kShapes) {
    auto table = random_vec<T>(vocab * dim, 141 + dim);
    auto ids = random_ids(n, vocab, 142 + n);
    ids[0] = int32_t(vocab - 1);
    std::vector<T> ref(n * dim);
    cpu::embedding_forward(ids.data(), table.data(), ref.data(), n, vocab, dim);
    DeviceBuffer<T> d_table(table), d_out(n * dim);
    DeviceBuffer<int32_t> d_ids(ids);
    cuda::embedding_forward(d_ids.get(), d_table.get(), d_out.get(), n, vocab, dim, nullptr);
    EXPECT_EQ(rel_error(d_out.to_host(), ref), 0.0) << n << "," << vocab << "," << dim;  // a copy is exact
  }
}

TYPED_TEST(EmbeddingCuda, BackwardMatchesCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  for (auto [n, vocab, dim] : kShapes) {
    const int64_t v = std::min<int64_t>(vocab, 17);  // few distinct ids: many repeats race
    auto dout = random_vec<T>(n * dim, 143 + dim);
    auto ids = random_ids(n, v, 144 + n);
    auto dtable = random_vec<float>(v * dim, 145 + dim);
    auto ref = dtable;
    cpu::embedding_backward(ids.data(), dout.data(), ref.data(), n, v, dim);
    DeviceBuffer<T> d_dout(dout);
    DeviceBuffer<int32_t> d_ids(ids);
    DeviceBuffer<float> d_table(dtable);
    cuda::embedding_backward(d_ids.get(), d_dout.get(), d_table.get(), n, v, dim, nullptr);
    // f32 sums of <= n / 17 + 1 terms in atomic (arbitrary) order vs the CPU's row order: a few
    // ulp of the row sums, far below 1e-5 relative.
    EXPECT_LT(rel_error(d_table.to_host(), ref), 1e-5) << n << "," << v << "," << dim;
  }
}

TYPED_TEST(EmbeddingCuda, OutOfRangeIdsGiveZeroRowsAndAreSkipped) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  const int64_t vocab = 10, dim = 24;
  std::vector<int32_t> ids = {3, -1, 9, 10, INT_MAX, INT_MIN, 0};
  const int64_t n = ids.size();
  auto table = random_vec<T>(vocab * dim, 151);
  auto dout = random_vec<T>(n * dim, 152);
  DeviceBuffer<T> d_table(table), d_out(n * dim), d_dout(dout);
  DeviceBuffer<int32_t> d_ids(ids);
  DeviceBuffer<float> d_dtable(std::vector<float>(vocab * dim, 0.f));
  cuda::embedding_forward(d_ids.get(), d_table.get(), d_out.get(), n, vocab, dim, nullptr);
  cuda::embedding_backward(d_ids.get(), d_dout.get(), d_dtable.get(), n, vocab, dim, nullptr);
  auto out = d_out.to_host();
  auto dtable = d_dtable.to_host();
  std::vector<float> ref_dtable(vocab * dim, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    const bool ok = ids[i] >= 0 && ids[i] < vocab;
    for (int64_t c = 0; c < dim; ++c) {
      const float want = ok ? float(to_acc(table[ids[i] * dim + c])) : 0.f;
      EXPECT_EQ(float(to_acc(out[i * dim + c])), want) << "row " << i << " col " << c;
      if (ok) ref_dtable[ids[i] * dim + c] += float(to_acc(dout[i * dim + c]));
    }
  }
  EXPECT_EQ(rel_error(dtable, ref_dtable), 0.0);  // every id distinct: one addition per element
}

}  // namespace
}  // namespace loom::test
