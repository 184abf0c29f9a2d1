// DequantScratch hands its kept buffer out again only when nothing else holds it, one per device for
// any shape and dtype that fits, and a model's NF4 experts dequantise into it with the same values as
// without; a checkpoint's recomputation keeps its dequantised experts for backward; experts dequantised
// a chunk at a time give the product of all at once; the scratch knows what its buffer holds.
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
    // Held: another take is a new buffer, not kept.
    Tensor b = s.take({2, 3, 4}, DType::f32, Device::cpu());
    EXPECT_NE(b.data_ptr(), first);
    EXPECT_EQ(s.kept_bytes(), 2 * 3 * 4 * 4);
  }
  // Let go: the kept one comes back, for any shape and dtype that fits in it.
  EXPECT_EQ(s.take({2, 3, 4}, DType::f32, Device::cpu()).data_ptr(), first);
  {
    Tensor view;
    {
      const Tensor c = s.take({4, 2, 3}, DType::bf16, Device::cpu());
      EXPECT_EQ(c.data_ptr(), first);
      EXPECT_EQ(c.shape(), Shape({4, 2, 3}));
      EXPECT_EQ(c.dtype(), DType::bf16);
      view = c.narrow(0, 1, 1);
    }
    // c is gone, but a view of it keeps the storage: still held.
    EXPECT_NE(s.take({2, 3, 4}, DType::f32, Device::cpu()).data_ptr(), first);
  }
  EXPECT_EQ(s.kept_bytes(), 2 * 3 * 4 * 4);
  // Larger than the kept buffer: it grows, and stays one buffer.
  const Tensor d = s.take({5, 3, 4}, DType::f32, Device::cpu());
  EXPECT_EQ(d.numel(), 5 * 3 * 4);
  EXPECT_EQ(s.kept_bytes(), 5 * 3 * 4 * 4);
  EXPECT_EQ(s.taken(), 6);
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
  {
    Tensor other = x.scratch->take({3, 8, 64}, DType::f32, Device::cpu());  // another taker writes it
    ops::fill_(other, 7.f);
  }
  {
    const Tensor again = x.dense_weight(DType::f32);  // into the same buffer, dequantised again
    EXPECT_EQ(again.data_ptr(), kept);
    EXPECT_EQ(again.to_doubles(), plain.to_doubles());
    EXPECT_EQ(x.scratch->taken(), 3);
  }
  const Tensor held_still = x.dense_weight(DType::f32);  // let go, nothing took it since: not dequantised again
  EXPECT_EQ(held_still.to_doubles(), plain.to_doubles());
  EXPECT_EQ(x.scratch->taken(), 3);
}

// A checkpointed expert product whose experts are one chunk dequantises twice a step, as one without
// checkpointing does: once in forward and once in the recomputation, whose weight backward keeps (with
// a scratch, the kept buffer is allocated either way). Here another product takes the scratch after
// each expert product (as a layer's down projection does after its gate_up): a weight not kept would be
// dequantised a third time. The input gradient is the same.
TEST(DequantScratch, RecomputationKeepsItsWeightForBackward) {
  ExpertLinear x;
  nf4_experts(x);
  x.scratch = std::make_shared<DequantScratch>();
  const std::vector<int64_t> offsets = {0, 2, 2, 5};
  const Tensor xs = random({5, 64}, 8);
  auto then_another = [&](const ag::Variable& in) {
    ag::Variable y = x.forward(in, offsets);
    x.scratch->take({4, 4}, DType::f32, Device::cpu());  // another product's weight
    return y;
  };

  ag::Variable plain_in(xs, true);
  ag::backward(ag::sum(then_another(plain_in)));
  EXPECT_EQ(x.scratch->taken(), 3);  // forward, the other, backward

  x.scratch->take({4, 4}, DType::f32, Device::cpu());  // other layers between the two steps
  const int64_t before = x.scratch->taken();
  ag::Variable ck_in(xs, true);
  const ag::CheckpointFn fn = [&](const std::vector<ag::Variable>& in) {
    return std::vector<ag::Variable>{then_another(in[0])};
  };
  ag::backward(ag::sum(ag::checkpoint(fn, {ck_in})[0]));
  // Forward and the other; the recomputation (kept for backward) and the other (a one-off beside it).
  EXPECT_EQ(x.scratch->taken() - before, 4);
  EXPECT_EQ(ck_in.grad().to_doubles(), plain_in.grad().to_doubles());
}

// A taker naming what it wrote (filled) finds it still there when nothing else took the buffer since,
// in the same shape and dtype; anything else must write it, and so must a taker after one that did not
// say it filled the buffer (a write that failed midway).
TEST(DequantScratch, KnowsWhatItsBufferHolds) {
  DequantScratch s;
  const DequantScratch::Contents a{std::make_shared<int>(1), 2}, b{std::make_shared<int>(2), 2};
  const Device cpu = Device::cpu();
  bool ready = true;
  // Takes and, when not ready, writes; whether it was ready.
  auto take = [&](DType dtype, const DequantScratch::Contents& c) {
    const Tensor t = s.take({2, 3}, dtype, cpu, c, &ready);
    if (!ready) s.filled(t, c);
    return ready;
  };
  EXPECT_FALSE(take(DType::f32, a));   // new
  EXPECT_TRUE(take(DType::f32, a));
  EXPECT_FALSE(take(DType::bf16, a));  // another dtype
  EXPECT_FALSE(take(DType::f32, a));   // the bf16 taker overwrote it
  EXPECT_TRUE(take(DType::f32, a));
  EXPECT_FALSE(take(DType::f32, b));   // other contents
  s.take({2, 3}, DType::f32, cpu);     // a plain take: contents unknown
  EXPECT_FALSE(take(DType::f32, b));
  s.take({2, 3}, DType::f32, cpu, a, &ready);  // not said filled: as if its write had failed
  EXPECT_FALSE(ready);
  EXPECT_FALSE(take(DType::f32, a));
  {
    const Tensor held = s.take({2, 3}, DType::f32, cpu, a, &ready);
    EXPECT_TRUE(ready);
    const Tensor one_off = s.take({2, 3}, DType::f32, cpu, a, &ready);
    EXPECT_FALSE(ready);  // the buffer is held: a new tensor, to be written
    EXPECT_NE(one_off.data_ptr(), held.data_ptr());
    s.filled(one_off, b);  // a one-off is not the buffer: nothing changes
  }
  EXPECT_TRUE(take(DType::f32, a));
  EXPECT_EQ(s.taken(), 9);  // the takes that were not ready
}

// Dequantised a chunk of experts at a time (one here, as Mixtral's are), an expert product gives the
// same output and input gradient as with every expert at once, and holds one expert's weight at most.
// A chunk without rows is skipped: the middle expert has none, so forward dequantises 2 of 3. Backward
// walks the chunks in reverse: the last expert forward made is still in the buffer, and only the first
// is dequantised again.
TEST(DequantScratch, ChunksOfExpertsGiveTheWholeProduct) {
  ExpertLinear x;
  nf4_experts(x);
  const std::vector<int64_t> offsets = {0, 2, 2, 5};
  const Tensor xs = random({5, 64}, 8);
  ag::Variable whole_in(xs, true);
  const ag::Variable whole = x.forward(whole_in, offsets);
  ag::backward(ag::sum(whole));

  x.scratch = std::make_shared<DequantScratch>();
  x.dequant_chunk = 1;
  EXPECT_EQ(x.chunk_experts(DType::f32), 1);
  ag::Variable in(xs, true);
  const ag::Variable chunked = x.forward(in, offsets);
  EXPECT_EQ(x.scratch->taken(), 2);
  ag::backward(ag::sum(chunked));
  EXPECT_EQ(x.scratch->taken(), 3);
  EXPECT_EQ(x.scratch->kept_bytes(), 8 * 64 * 4);  // one expert [8, 64] in f32
  EXPECT_EQ(chunked.value().to_doubles(), whole.value().to_doubles());
  EXPECT_EQ(in.grad().to_doubles(), whole_in.grad().to_doubles());
}

// The chunk by default: as few chunks of at most kDequantChunkBytes as can be, as even as can be.
TEST(DequantScratch, ChunksAreAsFewAndEvenAsTheBudgetAllows) {
  ExpertLinear qwen3_gate_up, qwen3_down, mixtral_gate_up, small;
  qwen3_gate_up.experts = 128, qwen3_gate_up.out = 1536, qwen3_gate_up.in = 2048;  // 6.3 MB an expert in bf16
  qwen3_down.experts = 128, qwen3_down.out = 2048, qwen3_down.in = 768;
  mixtral_gate_up.experts = 8, mixtral_gate_up.out = 28672, mixtral_gate_up.in = 4096;  // 235 MB an expert
  small.experts = 3, small.out = 8, small.in = 64;
  EXPECT_EQ(qwen3_gate_up.chunk_experts(DType::bf16), 32);  // 42 fit: 4 chunks
  EXPECT_EQ(qwen3_down.chunk_experts(DType::bf16), 64);     // 85 fit: 2 chunks
  EXPECT_EQ(qwen3_gate_up.chunk_experts(DType::f32), 19);   // 21 fit: 7 chunks, 6 of 19 and one of 14
  EXPECT_EQ(mixtral_gate_up.chunk_experts(DType::bf16), 1);
  EXPECT_EQ(small.chunk_experts(DType::bf16), 3);  // all at once
}

}  // namespace
}  // namespace loom
