// The NCCL Communicator on CUDA tensors (label cuda, run under mpiexec): every collective equals
// the MPI Communicator's on the same inputs copied to the host (cuda_world1.sh checks training).
#include <cmath>

#include "dist/ddp.h"
#define LOOM_MPI_TEST_CUDA
#include "tests/dist/mpi_main.h"

namespace loom::test {
namespace {

std::vector<float> input_of(int r, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(r)) * 4.f;
  return v;
}

void expect_same(const Tensor& cuda, const Tensor& cpu, double tol, const std::string& what) {
  const auto a = cuda.to_floats(), b = cpu.to_floats();
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << what << " " << i;
}

TEST(NcclCommunicator, CollectivesEqualMpi) {
  dist::ProcessGroup& g = group();
  dist::Communicator& nccl = g.for_device(g.device());
  dist::Communicator& mpi = g.cpu();
  ASSERT_EQ(nccl.backend(), "nccl");
  const int w = nccl.world_size(), me = nccl.rank();
  // f32 sums may add in another order: 1e-6 relative; bf16: one bf16 rounding per addition.
  for (DType dt : {DType::f32, DType::bf16}) {
    const double tol = dt == DType::f32 ? 1e-6 : 8e-3 * w;
    for (dist::ReduceOp op : {dist::ReduceOp::kSum, dist::ReduceOp::kAvg}) {
      Tensor h = Tensor::from_floats(input_of(me, 5000), {50, 100}).to(dt);
      Tensor d = h.to(g.device());
      mpi.all_reduce(h, op);
      mpi.wait();
      nccl.all_reduce(d, op);
      nccl.wait();
      expect_same(d, h, tol, "all_reduce");
    }
    std::vector<int64_t> counts(w);
    int64_t total = 0;
    for (int r = 0; r < w; ++r) total += counts[r] = 100 + 37 * r;
    Tensor hin = Tensor::from_floats(input_of(me, total), {total}).to(dt), din = hin.to(g.device());
    Tensor hout = Tensor::zeros({counts[me]}, dt), dout = Tensor::zeros({counts[me]}, dt, g.device());
    mpi.reduce_scatter(hin, hout, dist::ReduceOp::kSum, counts);
    mpi.wait();
    nccl.reduce_scatter(din, dout, dist::ReduceOp::kSum, counts);
    nccl.wait();
    expect_same(dout, hout, tol, "uneven reduce_scatter");
    Tensor hin2 = Tensor::from_floats(input_of(me, 64 * w), {64 * w}).to(dt), din2 = hin2.to(g.device());
    Tensor hout2 = Tensor::zeros({64}, dt), dout2 = Tensor::zeros({64}, dt, g.device());
    mpi.reduce_scatter(hin2, hout2, dist::ReduceOp::kAvg);
    mpi.wait();
    nccl.reduce_scatter(din2, dout2, dist::ReduceOp::kAvg);
    nccl.wait();
    expect_same(dout2, hout2, tol, "reduce_scatter");
    Tensor hg = Tensor::zeros({77 * w}, dt), dg = Tensor::zeros({77 * w}, dt, g.device());
    Tensor mine = Tensor::from_floats(input_of(me, 77), {77}).to(dt);
    mpi.all_gather(mine, hg);
    mpi.wait();
    nccl.all_gather(mine.to(g.device()), dg);
    nccl.wait();
    expect_same(dg, hg, 0, "all_gather");
    Tensor hb = Tensor::from_floats(input_of(me, 33), {33}).to(dt), db = hb.to(g.device());
    mpi.broadcast(hb, w - 1);
    mpi.wait();
    nccl.broadcast(db, w - 1);
    nccl.wait();
    expect_same(db, hb, 0, "broadcast");
  }
  nccl.barrier();
}

// wait_until: the inputs of the collectives up to a ticket are released while later ones still
// run, the pool hands their memory to new tensors written on the compute stream, and every
// collective still gives MPI's result (a free before the collective was done would show as
// overwritten inputs or outputs).
TEST(NcclCommunicator, WaitUntilReleasesWhatIsDoneAndNothingElse) {
  dist::ProcessGroup& g = group();
  dist::Communicator& nccl = g.for_device(g.device());
  dist::Communicator& mpi = g.cpu();
  const int w = nccl.world_size(), me = nccl.rank();
  constexpr int kCollectives = 6;
  constexpr int64_t kPer = 1 << 20;  // 4 MiB of f32 a rank: long enough to still run when the next is queued
  std::vector<Tensor> outs, want;
  int64_t first = 0;
  for (int k = 0; k < kCollectives; ++k) {
    Tensor h = Tensor::from_floats(input_of(me + k, kPer * w), {kPer * w});
    Tensor hout = Tensor::zeros({kPer}, DType::f32);
    mpi.reduce_scatter(h, hout, dist::ReduceOp::kSum);
    mpi.wait();
    want.push_back(hout);
    Tensor out = Tensor::zeros({kPer}, DType::f32, g.device());
    nccl.reduce_scatter(h.to(g.device()), out, dist::ReduceOp::kSum);  // the input lives only in the communicator
    if (k == 0) first = nccl.issued();
    outs.push_back(out);
    if (k >= 2) {
      nccl.wait_until(nccl.issued() - 2);  // two behind, as ZeRO-2 settles its buckets
      // New tensors on the compute stream may take the released inputs' memory: fill them.
      Tensor scratch = Tensor::full({kPer * w}, -7.f, DType::f32, g.device());
      (void)scratch;
    }
  }
  EXPECT_EQ(nccl.issued(), first + kCollectives - 1);
  nccl.wait();
  for (int k = 0; k < kCollectives; ++k) expect_same(outs[k], want[k], 1e-6, "reduce_scatter " + std::to_string(k));
  nccl.wait_until(0);  // already covered: nothing to do
  nccl.barrier();
}

}  // namespace
}  // namespace loom::test
