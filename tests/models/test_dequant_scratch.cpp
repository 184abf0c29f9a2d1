// DequantScratch hands its kept buffer out again only when nothing else holds it, keeps one per
// shape and dtype, and a model's NF4 experts dequantise into it with the same values as without; a
// checkpoint's recomputation keeps its dequantised experts for backward.
#include <gtest/gtest.h>

#include <random>

#include "models/dequant_scratch.h"
#include "models/layers.h"

namespace loom {
namespace {

Tensor random(const Shape& s, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(numel_of(s)));
  for (float& x : v) x = d(g);
  return Tensor::from_floats(v, s);
}

// Three NF4 experts [8, 64], as the loader quantises them (each expert alone), without a scratch.
void nf4_experts(ExpertLinear& x) {
  x.experts = 3, x.out = 8, x.in = 64;
  const Tensor w = random({3, 8, 64}, 7);
  for (int64_t e = 0; e < 3; ++e)
    x.nf4.push_back(std::make_shared<const Nf4Weight>(Nf4Weight::quantize(w.narrow(0, e, 1).reshape({8, 64}).contiguous())));
}

TEST(DequantScratch, ReusesABufferNobodyHolds) {
  DequantScratch s;
  const void* first = nullptr;
  {
    Tensor a = s.take({2, 3, 4}, DType::f32, Device::cpu());
    first = a.data_ptr();
    // Held: the same kind again is a new buffer, not kept.
    Tensor b = s.take({2, 3, 4}, DType::f32, Device::cpu());
    EXPECT_NE(b.data_ptr(), first);
    EXPECT_EQ(s.kept_bytes(), 2 * 3 * 4 * 4);
  }
  // Let go: the kept one comes back.
  EXPECT_EQ(s.take({2, 3, 4}, DType::f32, Device::cpu()).data_ptr(), first);
  // Another shape or dtype is a buffer of its own, kept beside the first.
  Tensor c = s.take({2, 4, 3}, DType::f32, Device::cpu());
  Tensor d = s.take({2, 3, 4}, DType::bf16, Device::cpu());
  EXPECT_NE(c.data_ptr(), first);
  EXPECT_NE(d.data_ptr(), first);
  EXPECT_EQ(s.kept_bytes(), 2 * 3 * 4 * 4 + 2 * 4 * 3 * 4 + 2 * 3 * 4 * 2);
  // A view keeps the storage: still held.
  Tensor view = c.narrow(0, 1, 1);
  EXPECT_NE(s.take({2, 4, 3}, DType::f32, Device::cpu()).data_ptr(), c.data_ptr());
}

TEST(DequantScratch, ExpertsDequantiseAsWithoutIt) {
  ExpertLinear x;
  nf4_experts(x);
  const Tensor plain = x.dense_weight(DType::f32);
  x.scratch = std::make_shared<DequantScratch>();
  const void* kept = nullptr;
  {
    const Tensor first = x.dense_weight(DType::f32);
    kept = first.data_ptr();
    EXPECT_EQ(first.to_doubles(), plain.to_doubles());
  }
  const Tensor again = x.dense_weight(DType::f32);  // into the same buffer, overwritten whole
  EXPECT_EQ(again.data_ptr(), kept);
  EXPECT_EQ(again.to_doubles(), plain.to_doubles());
}

// A checkpointed expert product dequantises twice a step, as one without checkpointing does: once in
// forward and once in the recomputation, whose weight backward keeps (with a scratch, the kept buffer
// is allocated either way), where it used to dequantise a third time. The input gradient is the same.
TEST(DequantScratch, RecomputationKeepsItsWeightForBackward) {
  ExpertLinear x;
  nf4_experts(x);
  x.scratch = std::make_shared<DequantScratch>();
  const std::vector<int64_t> offsets = {0, 2, 2, 5};
  const Tensor xs = random({5, 64}, 8);

  ag::Variable plain_in(xs, true);
  ag::backward(ag::sum(x.forward(plain_in, offsets)));
  EXPECT_EQ(x.scratch->taken(), 2);  // forward, backward

  ag::Variable ck_in(xs, true);
  const ag::CheckpointFn fn = [&](const std::vector<ag::Variable>& in) {
    return std::vector<ag::Variable>{x.forward(in[0], offsets)};
  };
  ag::backward(ag::sum(ag::checkpoint(fn, {ck_in})[0]));
  EXPECT_EQ(x.scratch->taken(), 4);  // forward, recomputation (kept for backward)
  EXPECT_EQ(ck_in.grad().to_doubles(), plain_in.grad().to_doubles());
}

}  // namespace
}  // namespace loom
