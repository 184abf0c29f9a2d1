// Tensor views, copies, casts and memory counters on the CPU (and CUDA when present).
#include <gtest/gtest.h>

#include "engine/ops.h"
#include "engine/tensor.h"

namespace loom::test {
namespace {

Tensor iota(const Shape& s, DType dtype = DType::f32) {
  std::vector<float> v(numel_of(s));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return Tensor::from_floats(v, s, dtype);
}

TEST(Tensor, ContiguousStridesAndViews) {
  Tensor t = iota({2, 3, 4});
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  Tensor v = t.view({6, -1});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_EQ(v.storage(), t.storage());
  EXPECT_THROW(t.view({5, 5}), Error);
  EXPECT_THROW(t.view({-1, -1}), Error);
}

TEST(Tensor, TransposeIsAViewAndContiguousCopies) {
  Tensor t = iota({2, 3});
  Tensor tt = t.transpose(0, 1);
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.storage(), t.storage());
  Tensor c = tt.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_floats(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_THROW(tt.view({6}), Error);
  EXPECT_EQ(tt.reshape({6}).to_floats(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, NarrowSelectUnsqueeze) {
  Tensor t = iota({3, 4});
  Tensor n = t.narrow(1, 1, 2);
  EXPECT_EQ(n.shape(), (Shape{3, 2}));
  EXPECT_EQ(n.to_floats(), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  Tensor r = t.narrow(0, 2, 1);
  EXPECT_TRUE(r.is_contiguous());
  EXPECT_EQ(r.to_floats(), (std::vector<float>{8, 9, 10, 11}));
  EXPECT_EQ(t.select(1, 3).to_floats(), (std::vector<float>{3, 7, 11}));
  EXPECT_EQ(t.unsqueeze(0).shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(t.unsqueeze(-1).shape(), (Shape{3, 4, 1}));
  EXPECT_THROW(t.narrow(1, 3, 2), Error);
  EXPECT_THROW(t.select(0, 3), Error);
}

TEST(Tensor, CastsRoundTripAndRoundToNearestEven) {
  Tensor t = Tensor::from_floats({1.0f, 1.00390625f, 1.01171875f, -2.5f, 65504.f}, {5});
  Tensor b = t.to(DType::bf16);
  EXPECT_EQ(b.nbytes(), 10);
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even mantissa wins (1). 1 + 3*2^-8 rounds up to 1 + 2^-6.
  EXPECT_EQ(b.to_floats(), (std::vector<float>{1.0f, 1.0f, 1.015625f, -2.5f, 65536.f}));  // 0x477FE000 rounds up
  Tensor d = t.to(DType::f64);
  EXPECT_EQ(d.to_doubles()[3], -2.5);
  EXPECT_THROW(t.to(DType::i32), Error);
}

TEST(Tensor, IntegerCopiesAreExact) {
  Tensor ids = Tensor::from_ints({16777217, -5, 3, 2147483647}, {2, 2});
  EXPECT_EQ(ids.transpose(0, 1).contiguous().to_ints(), (std::vector<int32_t>{16777217, 3, -5, 2147483647}));
}

TEST(Tensor, MemoryCountersTrackCurrentAndPeak) {
  const MemoryStats before = memory_stats(Device::cpu());
  reset_peak_memory(Device::cpu());
  {
    Tensor big = Tensor::empty({1 << 20}, DType::f32);
    EXPECT_GE(memory_stats(Device::cpu()).current_bytes, before.current_bytes + (4 << 20));
  }
  EXPECT_EQ(memory_stats(Device::cpu()).current_bytes, before.current_bytes);
  EXPECT_GE(memory_stats(Device::cpu()).peak_bytes, before.current_bytes + (4 << 20));
}

TEST(Tensor, ParseDevice) {
  EXPECT_TRUE(parse_device("cpu").ok());
  EXPECT_EQ(parse_device("cuda:3")->index, 3);
  EXPECT_FALSE(parse_device("tpu").ok());
  EXPECT_FALSE(parse_device("cuda:x").ok());
  EXPECT_NE(parse_device("gpu").status().message().find("gpu"), std::string::npos);
}

TEST(Tensor, CudaRoundTripWhenAvailable) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Tensor t = iota({3, 5});
  Tensor g = t.to(Device::cuda(0));
  EXPECT_TRUE(g.is_cuda());
  EXPECT_EQ(g.transpose(0, 1).contiguous().to_floats(), t.transpose(0, 1).contiguous().to_floats());
  EXPECT_EQ(g.to(DType::bf16).to(Device::cpu()).to_floats(), t.to(DType::bf16).to_floats());
  EXPECT_GT(memory_stats(Device::cuda(0)).current_bytes, 0);
}

}  // namespace
}  // namespace loom::test
