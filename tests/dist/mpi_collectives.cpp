// The MPI Communicator's collectives on CPU tensors against sums computed here in f64 from every
// rank's known inputs (f32, bf16, i64; sum and avg; even and uneven reduce-scatter), all-gather,
// broadcast, and the start-of-run configuration agreement refusing a differing field on every rank.
#include <cmath>

#include "dist/agreement.h"
#include "tests/dist/mpi_main.h"

namespace loom::test {
namespace {

// Rank r's input: element i is r * 1.5 + i * 0.25 - 3 (exact in bf16 for the sizes used).
std::vector<float> input_of(int r, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(r * 1.5 + (i % 64) * 0.25 - 3);
  return v;
}

double expected_sum(int world, int64_t i) {
  double s = 0;
  for (int r = 0; r < world; ++r) s += input_of(r, i + 1)[i];
  return s;
}

TEST(MpiCommunicator, AllReduceSumAndAvg) {
  dist::Communicator& c = group().cpu();
  const int w = c.world_size();
  for (DType dt : {DType::f32, DType::bf16}) {
    for (dist::ReduceOp op : {dist::ReduceOp::kSum, dist::ReduceOp::kAvg}) {
      Tensor t = Tensor::from_floats(input_of(c.rank(), 1000), {10, 100}).to(dt);
      c.all_reduce(t, op);
      c.wait();
      const auto got = t.to_floats();
      for (int64_t i = 0; i < 1000; ++i) {
        const double want = expected_sum(w, i) / (op == dist::ReduceOp::kAvg ? w : 1);
        // f32: exact (small integers and quarters); bf16: one rounding of the f32 sum per addition.
        const double tol = dt == DType::f32 ? 1e-6 : 2 * std::ldexp(std::abs(want) + 1, -8) * w;
        ASSERT_NEAR(got[i], want, tol) << name(dt) << " element " << i;
      }
    }
  }
  Tensor n = Tensor::zeros({3}, DType::i64);
  for (int k = 0; k < 3; ++k) n.data<int64_t>()[k] = (int64_t{1} << 40) + c.rank() * 7 + k;
  c.all_reduce(n, dist::ReduceOp::kSum);
  c.wait();
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(n.data<int64_t>()[k], w * ((int64_t{1} << 40) + k) + 7 * int64_t{w * (w - 1) / 2});
}

TEST(MpiCommunicator, ReduceScatterEvenAndUneven) {
  dist::Communicator& c = group().cpu();
  const int w = c.world_size(), me = c.rank();
  const int64_t per = 37;
  Tensor in = Tensor::from_floats(input_of(me, per * w), {per * w});
  Tensor out = Tensor::zeros({per}, DType::f32);
  c.reduce_scatter(in, out, dist::ReduceOp::kSum);
  c.wait();
  for (int64_t i = 0; i < per; ++i) ASSERT_NEAR(out.to_floats()[i], expected_sum(w, me * per + i), 1e-6);
  // Uneven: rank r receives r * 3 + 1 elements (rank 0 the fewest).
  std::vector<int64_t> counts(w);
  int64_t total = 0, start = 0;
  for (int r = 0; r < w; ++r) {
    counts[r] = r * 3 + 1;
    if (r < me) start += counts[r];
    total += counts[r];
  }
  Tensor in2 = Tensor::from_floats(input_of(me, total), {total});
  Tensor out2 = Tensor::zeros({counts[me]}, DType::f32);
  c.reduce_scatter(in2, out2, dist::ReduceOp::kAvg, counts);
  c.wait();
  for (int64_t i = 0; i < counts[me]; ++i) ASSERT_NEAR(out2.to_floats()[i], expected_sum(w, start + i) / w, 1e-6);
}

TEST(MpiCommunicator, AllGatherBroadcastBarrier) {
  dist::Communicator& c = group().cpu();
  const int w = c.world_size(), me = c.rank();
  Tensor mine = Tensor::from_floats(input_of(me, 5), {5}).to(DType::bf16);
  Tensor all = Tensor::zeros({5 * w}, DType::bf16);
  c.all_gather(mine, all);
  c.wait();
  const auto got = all.to_floats();
  for (int r = 0; r < w; ++r)
    for (int i = 0; i < 5; ++i) EXPECT_EQ(got[r * 5 + i], input_of(r, 5)[i]);
  const int root = w - 1;
  Tensor b = Tensor::from_floats(input_of(me, 9), {3, 3});
  c.broadcast(b, root);
  c.wait();
  EXPECT_EQ(b.to_floats(), input_of(root, 9));
  c.barrier();
}

TEST(MpiCommunicator, MisuseIsAnError) {
  dist::Communicator& c = group().cpu();
  Tensor t = Tensor::zeros({4, 4}, DType::f32).transpose(0, 1);
  EXPECT_THROW(c.all_reduce(t, dist::ReduceOp::kSum), Error);
  Tensor in = Tensor::zeros({5}, DType::f32), out = Tensor::zeros({2}, DType::f32);
  if (c.world_size() != 2) {
    EXPECT_THROW(c.reduce_scatter(in, out, dist::ReduceOp::kSum), Error);
  }
}

TEST(Agreement, SameFieldsPassAndADifferentFieldIsRefusedOnEveryRank) {
  dist::Communicator& c = group().cpu();
  std::vector<std::pair<std::string, std::string>> fields = {
      {"model", "/m"}, {"data", "/d.jsonl"}, {"seed", "42"}, {"dtype", "f32"}};
  EXPECT_TRUE(dist::check_agreement(c, fields).ok());
  if (c.world_size() < 2) return;
  if (c.rank() == c.world_size() - 1) fields[1].second = "/other.jsonl";
  const absl::Status s = dist::check_agreement(c, fields);
  ASSERT_FALSE(s.ok()) << "rank " << c.rank() << " accepted a differing data field";
  const std::string m(s.message());
  EXPECT_NE(m.find("data differs between rank 0 and rank " + std::to_string(c.world_size() - 1)), std::string::npos) << m;
  // Every rank's message carries both values: the rank that exits first may be the only one heard.
  EXPECT_NE(m.find("rank 0 has data = '/d.jsonl'"), std::string::npos) << m;
  EXPECT_NE(m.find("rank " + std::to_string(c.world_size() - 1) + " has data = '/other.jsonl'"), std::string::npos) << m;
  // A long value is cut, not sent whole.
  fields[1].second = c.rank() == 0 ? std::string(1000, 'a') : std::string(1000, 'b');
  const absl::Status t = dist::check_agreement(c, fields);
  ASSERT_FALSE(t.ok());
  const std::string cut(t.message());
  EXPECT_NE(cut.find("rank 1 has data = '" + std::string(197, 'b') + "...'"), std::string::npos) << cut;
}

}  // namespace
}  // namespace loom::test
