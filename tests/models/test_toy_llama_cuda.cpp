// The same ToyLlama on CUDA: identical initial weights (counter-based RNG), so the first losses
// match the CPU run — to f32 rounding in f32 compute, to bf16 tolerance in bf16 compute — and the
// gradients of every weight agree.
#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"
#include "tests/models/toy_training.h"

namespace loom::test {
namespace {

TEST(ToyLlamaCuda, FirstLossesMatchCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  ToyLlamaConfig c;
  ToyLlama cpu(c, Device::cpu(), DType::f32);
  ToyLlama gpu32(c, Device::cuda(0), DType::f32), gpu16(c, Device::cuda(0), DType::bf16);
  const auto ref = train_losses(cpu, toy_batch(c, 2, 16, Device::cpu()), 5);
  const auto l32 = train_losses(gpu32, toy_batch(c, 2, 16, Device::cuda(0)), 5);
  const auto l16 = train_losses(gpu16, toy_batch(c, 2, 16, Device::cuda(0)), 5);
  for (size_t i = 0; i < ref.size(); ++i) {
    // f32: only summation order differs (GEMM, reductions) and Adam amplifies tiny differences a little.
    EXPECT_NEAR(l32[i], ref[i], 1e-3f * ref[i]) << "f32 step " << i;
    // bf16 compute: ~2^-9 relative per rounded activation; 2% on the loss of this model.
    EXPECT_NEAR(l16[i], ref[i], 0.02f * ref[i]) << "bf16 step " << i;
  }
  EXPECT_LT(l16.back(), l16.front());
}

TEST(ToyLlamaCuda, GradientsMatchCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  ToyLlamaConfig c;
  ToyLlama cpu(c, Device::cpu(), DType::f32), gpu(c, Device::cuda(0), DType::f32);
  ag::backward(cpu.loss(toy_batch(c, 2, 16, Device::cpu()).ids, toy_batch(c, 2, 16, Device::cpu()).targets));
  const ToyBatch gb = toy_batch(c, 2, 16, Device::cuda(0));
  ag::backward(gpu.loss(gb.ids, gb.targets));
  for (size_t i = 0; i < cpu.parameters().size(); ++i) {
    const auto a = cpu.parameters()[i].grad().to_floats(), b = gpu.parameters()[i].grad().to_floats();
    EXPECT_LT(rel_error(b, a), 1e-4) << "parameter " << i;  // f32: summation order only
  }
}

}  // namespace
}  // namespace loom::test
