// CPU embedding: the forward is an exact row gather, the backward a scatter-add that sums repeated
// ids (checked against a naive f64 loop), and bad ids throw naming position and value.
#include "kernels/embedding.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

template <class T>
class EmbeddingCpu : public ::testing::Test {};
using Types = ::testing::Types<float, double, bf16>;
TYPED_TEST_SUITE(EmbeddingCpu, Types);

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, int32_t(vocab - 1));
  std::vector<int32_t> ids(n);
  for (auto& v : ids) v = dist(gen);
  return ids;
}

TYPED_TEST(EmbeddingCpu, ForwardGathersRows) {
  using T = TypeParam;
  const int64_t vocab = 50, dim = 37, n = 23;
  auto table = random_vec<T>(vocab * dim, 81);
  auto ids = random_ids(n, vocab, 82);
  ids[0] = 0;
  ids[1] = int32_t(vocab - 1);
  std::vector<T> out(n * dim);
  cpu::embedding_forward(ids.data(), table.data(), out.data(), n, vocab, dim);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < dim; ++c)
      ASSERT_EQ(double(to_acc(out[i * dim + c])), double(to_acc(table[ids[i] * dim + c]))) << i << "," << c;
}

TYPED_TEST(EmbeddingCpu, BackwardAccumulatesRepeatedIds) {
  using T = TypeParam;
  using A = Acc<T>;
  const int64_t vocab = 7, dim = 300, n = 40;  // n > vocab: ids repeat; dim spans two chunks
  auto dout = random_vec<T>(n * dim, 83);
  auto ids = random_ids(n, vocab, 84);
  auto dtable = random_vec<A>(vocab * dim, 85);  // += into existing values
  std::vector<double> ref(vocab * dim);
  for (int64_t k = 0; k < vocab * dim; ++k) ref[k] = double(dtable[k]);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < dim; ++c) ref[ids[i] * dim + c] += double(to_acc(dout[i * dim + c]));
  cpu::embedding_backward(ids.data(), dout.data(), dtable.data(), n, vocab, dim);
  // Sums of <= 41 terms of magnitude <= 1 in Acc<T>: f32 ~ 1e-6 relative, f64 ~ 1e-15.
  EXPECT_LT(rel_error(dtable, ref), sizeof(A) == 8 ? 1e-13 : 1e-6);
}

TEST(EmbeddingCpuChecks, BadIdThrowsWithPositionAndValue) {
  const int64_t vocab = 10, dim = 4;
  std::vector<float> table(vocab * dim, 1.f), out(3 * dim), dtable(vocab * dim);
  for (int32_t bad : {-1, 10, 1 << 30}) {
    std::vector<int32_t> ids = {3, bad, 5};
    try {
      cpu::embedding_forward(ids.data(), table.data(), out.data(), 3, vocab, dim);
      ADD_FAILURE() << "no throw for id " << bad;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("id " + std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("position 1"), std::string::npos) << msg;
    }
    EXPECT_THROW(cpu::embedding_backward(ids.data(), out.data(), dtable.data(), 3, vocab, dim), Error);
  }
}

}  // namespace
}  // namespace loom::test
