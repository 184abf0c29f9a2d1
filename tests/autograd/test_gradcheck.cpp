// Every differentiable function against f64 central finite differences on the CPU.
#include "tests/autograd/gradcheck.h"
#include "kernels/rope.h"

namespace loom::test {
namespace {

using ag::Variable;
using V = std::vector<Variable>;

TEST(GradCheck, AddSubMulScale) {
  auto a = random_f64({3, 5}, 1), b = random_f64({3, 5}, 2);
  gradcheck([](const V& x) { return ag::add(x[0], x[1]); }, {a, b});
  gradcheck([](const V& x) { return ag::sub(x[0], x[1]); }, {a, b});
  gradcheck([](const V& x) { return ag::mul(x[0], x[1]); }, {a, b});
  gradcheck([](const V& x) { return ag::mul(x[0], x[0]); }, {a});  // same input twice accumulates
  gradcheck([](const V& x) { return ag::scale(x[0], -2.5f); }, {a});
}

TEST(GradCheck, BiasCastShape) {
  auto a = random_f64({2, 3, 4}, 3), bias = random_f64({4}, 4);
  gradcheck([](const V& x) { return ag::add_bias(x[0], x[1]); }, {a, bias});
  gradcheck([](const V& x) { return ag::reshape(x[0], {6, 4}); }, {a});
  gradcheck([](const V& x) { return ag::transpose(x[0], 0, 2); }, {a});
  gradcheck([](const V& x) { return ag::narrow(x[0], 1, 1, 2); }, {a});
  gradcheck([](const V& x) { return ag::narrow(x[0], 0, 1, 1); }, {a});
  gradcheck([](const V& x) { return ag::narrow(x[0], 2, 0, 3); }, {a});
}

TEST(GradCheck, Softcap) {
  auto a = random_f64({4, 6}, 27, -8, 8);
  gradcheck([](const V& x) { return ag::softcap(x[0], 3.f); }, {a});
}

TEST(GradCheck, DropoutRegeneratesItsMask) {
  auto a = random_f64({5, 7}, 28);
  gradcheck([](const V& x) { return ag::dropout(x[0], 0.3f, 99, 1000); }, {a});
  // About p of the elements are dropped, the rest scaled by 1/(1-p).
  Tensor ones = Tensor::full({10000}, 1.f, DType::f32);
  int zeros = 0;
  for (float v : ops::dropout(ones, 0.3f, 5, 0).to_floats()) {
    if (v == 0.f) ++zeros;
    else EXPECT_FLOAT_EQ(v, 1.f / 0.7f);
  }
  EXPECT_NEAR(zeros / 10000.0, 0.3, 0.02);  // binomial sd 0.0046: 4 sd
}

TEST(GradCheck, MatmulAllTransposes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      auto a = random_f64(ta ? Shape{4, 3} : Shape{3, 4}, 5), b = random_f64(tb ? Shape{5, 4} : Shape{4, 5}, 6);
      gradcheck([=](const V& x) { return ag::matmul(x[0], x[1], ta, tb); }, {a, b});
      // batched on both sides
      auto ab = random_f64(ta ? Shape{2, 4, 3} : Shape{2, 3, 4}, 7), bb = random_f64(tb ? Shape{2, 5, 4} : Shape{2, 4, 5}, 8);
      gradcheck([=](const V& x) { return ag::matmul(x[0], x[1], ta, tb); }, {ab, bb});
    }
  // batched a with a shared 2-D b (how linear layers are used)
  for (bool tb : {false, true}) {
    auto a = random_f64({2, 3, 4}, 9), b = random_f64(tb ? Shape{5, 4} : Shape{4, 5}, 10);
    gradcheck([=](const V& x) { return ag::matmul(x[0], x[1], false, tb); }, {a, b});
  }
}

TEST(GradCheck, LinearWithBias) {
  auto x = random_f64({2, 3, 4}, 11), w = random_f64({6, 4}, 12), b = random_f64({6}, 13);
  gradcheck([](const V& v) { return ag::linear(v[0], v[1], &v[2]); }, {x, w, b});
}

TEST(GradCheck, RmsNormBothVariants) {
  auto x = random_f64({3, 7}, 14), w = random_f64({7}, 15, 0.5, 1.5);
  for (bool add_one : {false, true})
    gradcheck([=](const V& v) { return ag::rms_norm(v[0], v[1], 1e-6f, add_one); }, {x, w});
}

TEST(GradCheck, Rope) {
  const int64_t b = 2, s = 3, h = 2, d = 8;
  auto x = random_f64({b, s, h, d}, 16);
  Tensor pos = Tensor::from_ints({0, 1, 2, 0, 1, 5}, {b * s});
  Tensor inv = Tensor::from_floats(cpu::rope_inv_freq(d, 10000.0, RopeScaling{}), {d / 2});
  gradcheck([=](const V& v) { return ag::rope(v[0], pos, inv); }, {x});
}

TEST(GradCheck, GatedActivations) {
  auto g = random_f64({3, 5}, 17, -3, 3), u = random_f64({3, 5}, 18);
  gradcheck([](const V& v) { return ag::swiglu(v[0], v[1]); }, {g, u});
  gradcheck([](const V& v) { return ag::geglu(v[0], v[1]); }, {g, u});
}

TEST(GradCheck, Embedding) {
  auto table = random_f64({6, 4}, 19);
  Tensor ids = Tensor::from_ints({1, 5, 1, 0, 3}, {5});  // a repeated id accumulates
  gradcheck([=](const V& v) { return ag::embedding(ids, v[0]); }, {table});
}

struct AttnCase {
  int64_t batch, seq, heads, kv_heads, head_dim;
  float softcap;
  int64_t window;
  bool segments;
};

TEST(GradCheck, AttentionVariants) {
  const AttnCase cases[] = {
      {1, 5, 2, 2, 4, 0.f, 0, false},   // plain multi-head
      {2, 6, 4, 2, 4, 0.f, 0, false},   // grouped-query
      {1, 7, 2, 1, 4, 0.f, 3, false},   // sliding window
      {1, 5, 2, 1, 4, 2.0f, 0, false},  // logit soft-capping (small cap so tanh bends)
      {2, 6, 2, 1, 4, 0.f, 0, true},    // packed documents
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(testing::Message() << "seq=" << c.seq << " heads=" << c.heads << "/" << c.kv_heads
                                    << " softcap=" << c.softcap << " window=" << c.window);
    auto q = random_f64({c.batch, c.seq, c.heads, c.head_dim}, 20, -2, 2);
    auto k = random_f64({c.batch, c.seq, c.kv_heads, c.head_dim}, 21, -2, 2);
    auto v = random_f64({c.batch, c.seq, c.kv_heads, c.head_dim}, 22);
    ops::AttentionOptions opt;
    opt.softcap = c.softcap;
    opt.window = c.window;
    if (c.segments) {
      std::vector<int32_t> seg;
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t i = 0; i < c.seq; ++i) seg.push_back(i < 2 + b ? 0 : 1);
      opt.segment_ids = Tensor::from_ints(seg, {c.batch, c.seq});
    }
    gradcheck([=](const V& x) { return ag::attention(x[0], x[1], x[2], opt); }, {q, k, v});
  }
}

TEST(GradCheck, CrossEntropyMeanWithIgnoreAndSoftcap) {
  auto logits = random_f64({5, 7}, 23, -3, 3);
  Tensor targets = Tensor::from_ints({3, -100, 0, 6, 2}, {5});
  gradcheck([=](const V& v) { return ag::cross_entropy(v[0], targets); }, {logits});
  gradcheck([=](const V& v) { return ag::cross_entropy(v[0], targets, 2.5f); }, {logits});
}

TEST(GradCheck, CheckpointMatchesDirectGradients) {
  auto x = random_f64({2, 3, 4}, 24), w = random_f64({4, 4}, 25), g = random_f64({4}, 26, 0.5, 1.5);
  // fn captures nothing: weights come in as inputs; the same function with and without checkpoint.
  auto block = [](const V& v) {
    Variable h = ag::rms_norm(v[0], v[2], 1e-6f);
    return V{ag::add(v[0], ag::swiglu(ag::linear(h, v[1]), ag::linear(h, v[1])))};
  };
  gradcheck([=](const V& v) { return ag::checkpoint(block, v)[0]; }, {x, w, g});
  gradcheck([=](const V& v) { return ag::checkpoint(block, v, {.offload = true})[0]; }, {x, w, g});
}

}  // namespace
}  // namespace loom::test
