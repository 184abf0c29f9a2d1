// Tape mechanics: recording only when needed, no-grad, hooks, saved-tensor release, captured
// weights inside checkpoint().
#include <gtest/gtest.h>

#include "autograd/functions.h"
#include "engine/memory.h"

namespace loom::test {
namespace {

using ag::Variable;

Tensor ones(const Shape& s) { return Tensor::full(s, 1.f, DType::f64); }

TEST(Tape, RecordsOnlyWhenAnInputRequiresGrad) {
  ag::clear_tape();
  Variable a(ones({2})), b(ones({2}));
  Variable c = ag::mul(a, b);
  EXPECT_FALSE(c.requires_grad());
  EXPECT_EQ(ag::tape_size(), 0u);
  Variable w(ones({2}), true);
  Variable d = ag::mul(a, w);
  EXPECT_TRUE(d.requires_grad());
  EXPECT_EQ(ag::tape_size(), 1u);
  {
    ag::NoGradGuard ng;
    Variable e = ag::mul(d, w);
    EXPECT_FALSE(e.requires_grad());
  }
  EXPECT_EQ(ag::tape_size(), 1u);
  ag::clear_tape();
}

TEST(Tape, GradientsAccumulateAcrossBackwardsUntilZeroed) {
  Variable w(Tensor::from_doubles({2.0, 3.0}, {2}), true);
  Variable x(Tensor::from_doubles({5.0, 7.0}, {2}));
  for (int i = 0; i < 2; ++i) ag::backward(ag::mul(w, x), ones({2}));
  EXPECT_EQ(w.grad().to_doubles(), (std::vector<double>{10.0, 14.0}));
  w.zero_grad();
  EXPECT_FALSE(w.grad().defined());
}

TEST(Tape, HookFiresOnceWithTheFinalGradient) {
  Variable w(Tensor::from_doubles({1.0, 2.0}, {2}), true);
  int calls = 0;
  std::vector<double> seen;
  w.add_grad_hook([&](Tensor& g) {
    ++calls;
    seen = g.to_doubles();
  });
  // w used twice: the hook must wait for both contributions.
  Variable y = ag::add(ag::scale(w, 2.f), ag::scale(w, 3.f));
  ag::backward(y, ones({2}));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<double>{5.0, 5.0}));
}

TEST(Tape, SavedTensorsAreReleasedByBackward) {
  Variable w(Tensor::from_doubles({1.0, 2.0}, {2}), true);
  std::weak_ptr<Storage> saved;
  {
    Variable x(Tensor::from_doubles({3.0, 4.0}, {2}));
    saved = x.value().storage();
    Variable y = ag::mul(w, x);  // the node keeps x alive for w's gradient
    x = Variable();
    EXPECT_FALSE(saved.expired());
    ag::backward(y, ones({2}));
    EXPECT_TRUE(saved.expired()) << "mul's saved input outlived its node";
  }
}

TEST(Tape, LoraLinearDropsItsRecomputedInputBeforeDx) {
  // down_proj's adapter computes its input again in backward (models/layers.cpp); once dA has it,
  // that copy must be gone before dx (the same size) is allocated. The weight callback runs right
  // before dx's product, so it sees whether the recomputed input is still alive.
  const Tensor gate = Tensor::full({4, 6}, 0.5f, DType::f64), up = Tensor::full({4, 6}, -1.5f, DType::f64);
  const Tensor wv = Tensor::full({3, 6}, 0.25f, DType::f64);
  std::weak_ptr<Storage> recomputed;
  bool alive_at_dx = true;
  int weight_calls = 0;
  ag::InputFn again = [&] {
    Tensor t = ops::swiglu(gate, up);
    recomputed = t.storage();
    return t;
  };
  ag::WeightFn weight = [&] {
    if (++weight_calls == 2) alive_at_dx = !recomputed.expired();  // call 1 gives the forward its weight
    return wv;
  };
  Variable x(ops::swiglu(gate, up), true);
  Variable a(Tensor::full({2, 6}, 0.1f, DType::f64), true), b(Tensor::full({3, 2}, 0.2f, DType::f64), true);
  Variable y = ag::lora_linear(x, Variable(weight(), false), a, b, ag::LoraArgs{1.f, 0.f, 0, 0}, nullptr, weight, again);
  ag::backward(y, ones({4, 3}));
  EXPECT_EQ(weight_calls, 2);
  EXPECT_FALSE(alive_at_dx) << "the recomputed input was still held when dx was computed";
  EXPECT_TRUE(x.grad().defined() && a.grad().defined() && b.grad().defined());
}

TEST(Tape, UnneededInputsAreNotKeptAlive) {
  Variable w(Tensor::from_doubles({1.0, 2.0}, {2}), true);
  std::weak_ptr<Storage> w_value = w.value().storage();
  Variable x(Tensor::from_doubles({3.0, 4.0}, {2}));
  Variable y = ag::mul(w, x);  // x needs no gradient, so w's value is not saved
  w.set_value(Tensor::from_doubles({0.0, 0.0}, {2}));
  EXPECT_TRUE(w_value.expired());
  ag::backward(y, ones({2}));
  EXPECT_EQ(w.grad().to_doubles(), (std::vector<double>{3.0, 4.0}));
}

TEST(Tape, CheckpointGivesCapturedWeightsTheirGradients) {
  Variable w(Tensor::from_doubles({2.0, -1.0}, {2}), true);
  Variable x(Tensor::from_doubles({3.0, 4.0}, {2}), true);
  auto fn = [&](const std::vector<Variable>& in) { return std::vector<Variable>{ag::mul(ag::mul(in[0], w), in[0])}; };
  Variable y = ag::checkpoint(fn, {x})[0];
  EXPECT_EQ(ag::tape_size(), 1u);  // only the checkpoint node: the inside was not recorded
  ag::backward(y, ones({2}));
  EXPECT_EQ(w.grad().to_doubles(), (std::vector<double>{9.0, 16.0}));  // x^2
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{12.0, -8.0}));  // 2 w x
}

TEST(Tape, LeavesNeverShareGradientStorage) {
  // add() hands one gradient tensor to both inputs; accumulating into one must not touch the other.
  Variable p(Tensor::from_doubles({1.0}, {1}), true), q(Tensor::from_doubles({2.0}, {1}), true);
  for (int i = 0; i < 2; ++i) ag::backward(ag::add(p, q), ones({1}));
  EXPECT_EQ(p.grad().to_doubles(), (std::vector<double>{2.0}));
  EXPECT_EQ(q.grad().to_doubles(), (std::vector<double>{2.0}));
  p.zero_grad();
  q.zero_grad();
  Variable c(Tensor::from_doubles({5.0}, {1}));
  // mul is recorded first, so p's gradient from add arrives first and mul's is added into it after.
  Variable loss = ag::add(ag::mul(p, c), ag::add(p, q));
  ag::backward(loss, ones({1}));
  EXPECT_EQ(p.grad().to_doubles(), (std::vector<double>{6.0}));
  EXPECT_EQ(q.grad().to_doubles(), (std::vector<double>{1.0}));
}

// A gradient made in the long-lived pool (an adapter's dA and dB) and held by no one else becomes the
// leaf's gradient as it is; any other is copied, so that the leaf's gradient, accumulated in place
// later, is never storage another tensor sees.
TEST(Tape, ALongLivedGradientHeldByNoOneElseBecomesTheLeafGradientUncopied) {
  auto long_lived = [](float v) {
    const LongLivedPoolScope scope;
    return Tensor::full({2, 3}, v, DType::f32);
  };
  auto leaf = [] {
    ag::GradCell cell;
    cell.shape = {2, 3};
    cell.dtype = DType::f32;
    cell.is_leaf = true;
    return cell;
  };
  {  // adopted, then the next gradient is added into it in place
    ag::GradCell cell = leaf();
    Tensor g = long_lived(1.5f);
    const void* p = g.data_ptr();
    ag::accumulate_grad(cell, g, "test");
    g = Tensor();
    EXPECT_EQ(cell.grad.data_ptr(), p);
    ag::accumulate_grad(cell, long_lived(2.f), "test");
    EXPECT_EQ(cell.grad.data_ptr(), p);
    EXPECT_EQ(cell.grad.to_doubles(), std::vector<double>(6, 3.5));
  }
  {  // held by another tensor too: copied
    ag::GradCell cell = leaf();
    const Tensor g = long_lived(1.f), other = g;
    ag::accumulate_grad(cell, g, "test");
    EXPECT_NE(cell.grad.data_ptr(), g.data_ptr());
    ag::accumulate_grad(cell, long_lived(1.f), "test");
    EXPECT_EQ(other.to_doubles(), std::vector<double>(6, 1.0));
  }
  {  // made outside the long-lived pool: copied
    ag::GradCell cell = leaf();
    Tensor g = Tensor::full({2, 3}, 1.f, DType::f32);
    const void* p = g.data_ptr();
    ag::accumulate_grad(cell, g, "test");
    EXPECT_NE(cell.grad.data_ptr(), p);
  }
  {  // a view of part of a long-lived block: copied
    ag::GradCell cell = leaf();
    Tensor block;
    {
      const LongLivedPoolScope scope;
      block = Tensor::full({4, 3}, 1.f, DType::f32);
    }
    Tensor g = block.narrow(0, 0, 2);
    block = Tensor();
    const void* p = g.data_ptr();
    ag::accumulate_grad(cell, g, "test");
    EXPECT_NE(cell.grad.data_ptr(), p);
  }
}

TEST(Tape, GradientShapeMismatchIsReported) {
  ag::GradCell cell;
  cell.shape = {2, 3};
  cell.dtype = DType::f64;
  EXPECT_THROW(ag::accumulate_grad(cell, Tensor::zeros({3, 2}, DType::f64), "test"), Error);
  EXPECT_THROW(ag::accumulate_grad(cell, Tensor::zeros({2, 3}, DType::f32), "test"), Error);
}

}  // namespace
}  // namespace loom::test
