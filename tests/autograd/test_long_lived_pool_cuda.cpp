// What outlives the layer that makes it goes to the long-lived pool (engine/memory.h's
// LongLivedPoolScope), out of the activations' way: a leaf's gradient on a GPU, handed back there by
// zero_grad (a gradient accumulated into it makes nothing new; its values are the CPU backward's), and
// the input a recompute checkpoint keeps until its backward.
#include <gtest/gtest.h>

#include "autograd/functions.h"
#include "engine/memory.h"

namespace loom {
namespace {

TEST(LeafGradients, AreMadeInTheLongLivedPool) {
  const Device gpu = Device::cuda(0);
  // 4 MiB each, a multiple of any pool granularity.
  std::vector<float> wv(1 << 20), xv(1 << 20);
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = float(i % 7) - 3.f, xv[i] = float(i % 5) * 0.25f;
  const Tensor w0 = Tensor::from_floats(wv, {1024, 1024}), x0 = Tensor::from_floats(xv, {1024, 1024});
  ag::Variable w(w0.to(gpu), true), cpu_w(w0, true);
  const int64_t before = long_lived_pool_bytes(gpu).used;
  ag::backward(ag::sum(ag::mul(w, ag::Variable(x0.to(gpu), false))));
  ag::backward(ag::sum(ag::mul(cpu_w, ag::Variable(x0, false))));
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(long_lived_pool_bytes(gpu).used, before + w.grad().nbytes());
  EXPECT_EQ(w.grad().to_floats(), cpu_w.grad().to_floats());
  // A second backward accumulates into it: nothing new in the pool.
  ag::backward(ag::sum(ag::mul(w, ag::Variable(x0.to(gpu), false))));
  EXPECT_EQ(long_lived_pool_bytes(gpu).used, before + w.grad().nbytes());
  w.zero_grad();
  EXPECT_EQ(long_lived_pool_bytes(gpu).used, before);
}

TEST(CheckpointInputs, AreKeptInTheLongLivedPool) {
  const Device gpu = Device::cuda(0);
  std::vector<float> xv(1 << 20);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(i % 9) * 0.5f - 2.f;
  const Tensor x0 = Tensor::from_floats(xv, {1024, 1024});
  ag::Variable x(x0.to(gpu), true), cpu_x(x0, true);
  const ag::CheckpointFn square = [](const std::vector<ag::Variable>& in) {
    return std::vector<ag::Variable>{ag::mul(in[0], in[0])};
  };
  const int64_t before = long_lived_pool_bytes(gpu).used;
  const ag::Variable y = ag::sum(ag::checkpoint(square, {x})[0]);
  EXPECT_EQ(long_lived_pool_bytes(gpu).used, before + x0.nbytes());  // the kept copy
  ag::backward(y);
  ag::backward(ag::sum(ag::checkpoint(square, {cpu_x})[0]));
  // The copy was let go with the checkpoint; x's gradient is there now, with the CPU's values.
  EXPECT_EQ(long_lived_pool_bytes(gpu).used, before + x0.nbytes());
  EXPECT_EQ(x.grad().to_floats(), cpu_x.grad().to_floats());
  x.zero_grad();
  EXPECT_EQ(long_lived_pool_bytes(gpu).used, before);
}

}  // namespace
}  // namespace loom
