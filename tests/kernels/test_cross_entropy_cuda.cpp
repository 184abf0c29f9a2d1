// CUDA cross-entropy against the CPU reference: vocabularies from 1 to Gemma's 256k, soft-capping,
// ignored rows, and out-of-range targets (treated as ignored on the GPU).
#include <cmath>
#include <string>

#include "kernels/cross_entropy.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

struct Case {
  int64_t n, vocab;
  float softcap, range;  // logits uniform in [-range, range)
};
const Case kCases[] = {{7, 1, 0.f, 1.f},      {9, 37, 0.f, 3.f},      {6, 1000, 0.f, 2.f},  {6, 50257, 0.f, 4.f},
                       {6, 50257, 30.f, 40.f}, {6, 262144, 30.f, 40.f}, {6, 1000, 5.f, 10.f}};

// Row i: a valid class, ignore_index, or (rows 3 and 5) a target outside [0, vocab).
std::vector<int32_t> make_targets(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) {
    t[i] = int32_t(gen() % vocab);
    if (i == 1) t[i] = kIgnoreIndex;
    if (i == 3) t[i] = int32_t(vocab);
    if (i == 5) t[i] = -7;
  }
  t[n - 1] = int32_t(vocab - 1);  // the last class, where an off-by-one would show
  return t;
}

// The CPU rejects out-of-range targets; the GPU ignores them. Give the CPU the GPU's view.
std::vector<int32_t> as_ignored(std::vector<int32_t> t, int64_t vocab) {
  for (auto& x : t)
    if (x < 0 || x >= vocab) x = kIgnoreIndex;
  return t;
}

template <class T>
class CrossEntropyCuda : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(CrossEntropyCuda, Types);

std::string name_of(const Case& c) {
  return "n=" + std::to_string(c.n) + " vocab=" + std::to_string(c.vocab) + " softcap=" + std::to_string(c.softcap);
}

// lse and loss are f32 on both sides (inputs exact in f32). The GPU sums up to vocab / 256 = 1024
// terms per thread in f32, then a tree; the CPU sums in f64. Error ~ sqrt(1024) * 2^-24 relative to
// the sum plus |z| * 2^-24 from z - m: ~5e-6 absolute in lse; allow 2e-5. Dropping even one
// 256-element stride of a 256k row moves lse by 1e-3.
constexpr double kLseTol = 2e-5;

TYPED_TEST(CrossEntropyCuda, ForwardMatchesCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  for (const Case& c : kCases) {
    auto x = random_vec<T>(c.n * c.vocab, 3 + c.vocab, -c.range, c.range);
    auto t = make_targets(c.n, c.vocab, 4);
    const auto t_cpu = as_ignored(t, c.vocab);
    std::vector<float> ref_loss(c.n), ref_lse(c.n);
    cpu::cross_entropy_forward(x.data(), t_cpu.data(), ref_loss.data(), ref_lse.data(), c.n, c.vocab, c.softcap,
                               kIgnoreIndex);
    DeviceBuffer<T> dx(x);
    DeviceBuffer<int32_t> dt(t);
    DeviceBuffer<float> loss(c.n), lse(c.n);
    cuda::cross_entropy_forward(dx.get(), dt.get(), loss.get(), lse.get(), c.n, c.vocab, c.softcap, kIgnoreIndex,
                                nullptr);
    expect_close(lse.to_host(), ref_lse, 0.0, kLseTol, name_of(c) + " lse");
    expect_close(loss.to_host(), ref_loss, 0.0, kLseTol, name_of(c) + " loss");
  }
}

// Gradients: both sides get the CPU's lse, so they differ only in expf/tanhf versus std::exp/
// std::tanh (a few ulp; with softcap the argument z - lse reaches -80, so 1 ulp of z is 5e-6 of p):
// f32 rtol 2e-5. bf16 outputs are then rounded, and values near a rounding boundary may land one
// ulp apart: 2^-7 relative, rtol 8e-3.
template <class T> double grad_rtol() { return 2e-5; }
template <> double grad_rtol<bf16>() { return 8e-3; }

TYPED_TEST(CrossEntropyCuda, BackwardMatchesCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  for (const Case& c : kCases) {
    auto x = random_vec<T>(c.n * c.vocab, 13 + c.vocab, -c.range, c.range);
    auto t = make_targets(c.n, c.vocab, 14);
    const auto t_cpu = as_ignored(t, c.vocab);
    auto dloss = random_vec<float>(c.n, 15, 0.5f, 1.5f);
    std::vector<float> loss(c.n), lse(c.n);
    cpu::cross_entropy_forward(x.data(), t_cpu.data(), loss.data(), lse.data(), c.n, c.vocab, c.softcap,
                               kIgnoreIndex);
    std::vector<T> ref(c.n * c.vocab);
    cpu::cross_entropy_backward(x.data(), t_cpu.data(), lse.data(), dloss.data(), ref.data(), c.n, c.vocab, c.softcap,
                                kIgnoreIndex);
    DeviceBuffer<T> dx(x), grad(c.n * c.vocab);
    DeviceBuffer<int32_t> dt(t);
    DeviceBuffer<float> dlse(lse), ddloss(dloss);
    cuda::cross_entropy_backward(dx.get(), dt.get(), dlse.get(), ddloss.get(), grad.get(), c.n, c.vocab, c.softcap,
                                 kIgnoreIndex, nullptr);
    expect_close(grad.to_host(), ref, grad_rtol<T>(), 1e-12, name_of(c) + " dlogits");
  }
}

}  // namespace
}  // namespace loom::test
