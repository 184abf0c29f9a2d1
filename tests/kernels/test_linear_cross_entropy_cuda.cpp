// CUDA fused linear + cross-entropy against the CPU reference in f32 and bf16: several chunks
// (the last one short), soft-cap, ignored and out-of-range targets, dh only and dh + dW.
#include <cublasLt.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cross_entropy.h"  // kIgnoreIndex
#include "kernels/linear_cross_entropy.h"
#include "tests/kernels/cublaslt_test.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

struct Case {
  int64_t n, vocab, hidden, chunk;
  float softcap;
  bool dw;
};
// The row kernel reads 8 bf16, 4 f32 or 1 logit per thread at a time (256 threads: tiles of 2048,
// 1024 or 256): vocab 3000, 5003 and 9000 cross tiles and end in a partial one, vocab 1000 is one
// partial bf16 tile. n = 300 with chunk 128 gives chunks of 128, 128, 44; n = 1100 with chunk 1024
// chunks of 1024 and 76. Long rows: vocab 30000 and 40104 (many tiles, a partial last one) and
// Llama 3's 128,256 (the row pass's whole width in the 1B and 8B trainings).
const Case kCases[] = {{300, 1000, 64, 128, 0.f, true}, {300, 1000, 64, 128, 5.f, true},
                       {77, 3000, 32, 32, 2.f, true},   {77, 5003, 32, 32, 0.f, false},
                       {77, 5003, 32, 0, 3.f, true},    {1, 7, 16, 1, 0.f, true},
                       {1100, 9000, 16, 1024, 0.f, true}, {1100, 5003, 16, 1024, 4.f, false},
                       {130, 30000, 16, 64, 2.f, true}, {77, 40104, 16, 32, 0.f, false},
                       {6, 128256, 8, 0, 0.f, true}};

// Every fourth row ignored; row 5 carries an out-of-range target, which CUDA treats as ignored
// (the CPU reference, which would throw, gets ignore_index there).
std::vector<int32_t> make_targets(int64_t n, int64_t vocab, uint32_t seed, bool cpu) {
  std::mt19937 gen(seed);
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i % 4 == 2 ? kIgnoreIndex : static_cast<int32_t>(gen() % vocab);
  if (n > 5) t[5] = cpu ? kIgnoreIndex : static_cast<int32_t>(vocab + 3);
  return t;
}

class LinearCrossEntropyCuda : public CublasLtTest {
 protected:
  // Tolerances (relative L2 unless said otherwise), CUDA against the CPU reference on the same
  // rounded inputs: f32 differs only in GEMM and reduction order (~1e-6; 1e-4 leaves margin for
  // exp amplifying logit differences). bf16: both sides accumulate logits in f32 and round them to
  // bf16 (kernels/linear_cross_entropy.h), then round dlogits to bf16, so a logit or a dlogit can
  // differ by one bf16 ulp (2^-8 relative) where the f32 values straddle a rounding boundary, and
  // dh is itself rounded to bf16 (2^-9): 1e-2 for dh and dW. The loss is summed in f32 on both
  // sides; a target logit one ulp apart moves its row's loss by ~2^-8 |z|, a few 1e-5 of the mean:
  // 1e-4 relative (bf16) and 1e-5 (f32).
  template <class T>
  void run(double tol_grad, double tol_loss) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(testing::Message() << "n=" << c.n << " vocab=" << c.vocab << " hidden=" << c.hidden
                                      << " chunk=" << c.chunk << " softcap=" << c.softcap << " dw=" << c.dw);
      const auto h = random_vec<T>(c.n * c.hidden, 1), w = random_vec<T>(c.vocab * c.hidden, 2);
      const auto t_cpu = make_targets(c.n, c.vocab, 3, true), t_gpu = make_targets(c.n, c.vocab, 3, false);
      float ref_loss = 0;
      std::vector<T> ref_dh(c.n * c.hidden);
      std::vector<float> ref_dw(c.vocab * c.hidden, 0.f);
      cpu::linear_cross_entropy(h.data(), w.data(), t_cpu.data(), &ref_loss, ref_dh.data(), ref_dw.data(), c.n,
                                c.vocab, c.hidden, c.softcap, kIgnoreIndex, c.chunk);

      DeviceBuffer<T> dh_in(h), dw_in(w), dh(c.n * c.hidden);
      DeviceBuffer<int32_t> targets(t_gpu);
      // dw starts as NaN: the first chunk must overwrite it (beta 0), not accumulate into it.
      DeviceBuffer<float> loss(1), dw(std::vector<float>(c.vocab * c.hidden, NAN));
      DeviceBuffer<unsigned char> scratch(cuda::linear_cross_entropy_scratch_bytes(c.n, c.vocab, c.chunk, std::is_same_v<T, bf16>));
      cuda::linear_cross_entropy(dh_in.get(), dw_in.get(), targets.get(), loss.get(), dh.get(),
                                 c.dw ? dw.get() : nullptr, c.n, c.vocab, c.hidden, c.softcap, kIgnoreIndex, c.chunk,
                                 scratch.get(), handle_, {ws_->get(), kGemmWorkspaceBytes}, nullptr);
      const float got_loss = loss.to_host()[0];
      EXPECT_NEAR(got_loss, ref_loss, tol_loss * std::max(1.f, std::abs(ref_loss)));
      EXPECT_LT(rel_error(dh.to_host(), ref_dh), tol_grad);
      if (c.dw) {
        EXPECT_LT(rel_error(dw.to_host(), ref_dw), tol_grad);
      }
    }
  }
};

TEST_F(LinearCrossEntropyCuda, F32MatchesCpu) { run<float>(1e-4, 1e-5); }
TEST_F(LinearCrossEntropyCuda, Bf16MatchesCpu) { run<bf16>(1e-2, 1e-4); }

TEST_F(LinearCrossEntropyCuda, AllIgnoredGivesZeroLossAndGradients) {
  const int64_t n = 9, vocab = 300, hidden = 16;
  const auto h = random_vec<bf16>(n * hidden, 1), w = random_vec<bf16>(vocab * hidden, 2);
  DeviceBuffer<bf16> hd(h), wd(w), dh(n * hidden);
  DeviceBuffer<int32_t> targets(std::vector<int32_t>(n, kIgnoreIndex));
  DeviceBuffer<float> loss(1), dw(std::vector<float>(vocab * hidden, NAN));
  DeviceBuffer<unsigned char> scratch(cuda::linear_cross_entropy_scratch_bytes(n, vocab, 4, true));
  cuda::linear_cross_entropy(hd.get(), wd.get(), targets.get(), loss.get(), dh.get(), dw.get(), n, vocab, hidden, 0.f,
                             kIgnoreIndex, 4, scratch.get(), handle_, {ws_->get(), kGemmWorkspaceBytes}, nullptr);
  EXPECT_EQ(loss.to_host()[0], 0.f);
  for (bf16 x : dh.to_host()) EXPECT_EQ(to_acc(x), 0.f);
  for (float x : dw.to_host()) EXPECT_EQ(x, 0.f);
}

TEST_F(LinearCrossEntropyCuda, ScaleByScalar) {
  const std::vector<float> x = {1.f, -2.f, 3.5f};
  DeviceBuffer<float> xd(x), s(std::vector<float>{0.5f});
  cuda::scale_by_scalar(xd.get(), s.get(), 3, nullptr);
  const std::vector<float> got = xd.to_host();
  EXPECT_EQ(got, (std::vector<float>{0.5f, -1.f, 1.75f}));
}

}  // namespace
}  // namespace loom::test
