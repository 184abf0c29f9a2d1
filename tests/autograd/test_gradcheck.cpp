// Every differentiable function against f64 central finite differences on the CPU.
#include "tests/autograd/gradcheck.h"
#include "kernels/rope.h"
#include "tests/kernels/kernel_test_util.h"

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

// The fused residual add + norm with both outputs used (h by the residual stream, the norm by the
// next layer), both variants of the weight; and the same bits as add then rms_norm on the CPU.
TEST(GradCheck, AddRmsNorm) {
  auto x = random_f64({3, 7}, 21), r = random_f64({3, 7}, 22), w = random_f64({7}, 23, 0.5, 1.5);
  auto c = random_f64({3, 7}, 24);
  for (bool add_one : {false, true}) {
    gradcheck(
        [=](const V& v) {
          auto [h, y] = ag::add_rms_norm(v[0], v[1], v[2], 1e-6f, add_one);
          return ag::add(ag::mul(h, Variable(c)), y);
        },
        {x, r, w});
  }
  const Tensor xf = x.to(DType::f32), rf = r.to(DType::f32), wf = w.to(DType::f32), cf = c.to(DType::f32);
  std::vector<Tensor> grads[2];
  for (int fused = 0; fused < 2; ++fused) {
    Variable xv(xf.clone(), true), rv(rf.clone(), true), wv(wf.clone(), true);
    Variable h, y;
    if (fused) {
      std::tie(h, y) = ag::add_rms_norm(xv, rv, wv, 1e-6f);
    } else {
      h = ag::add(xv, rv);
      y = ag::rms_norm(h, wv, 1e-6f);
    }
    ag::backward(ag::sum(ag::add(ag::mul(h, Variable(cf)), y)));
    grads[fused] = {h.value(), y.value(), xv.grad(), rv.grad(), wv.grad()};
  }
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_EQ(grads[0][i].to_floats(), grads[1][i].to_floats()) << i;
}

// q and k through one rope node (grouped-query head counts), both outputs used.
TEST(GradCheck, RopeQk) {
  const int64_t b = 2, s = 3, d = 8;
  auto q = random_f64({b, s, 4, d}, 31), k = random_f64({b, s, 2, d}, 32), c = random_f64({b, s, 2, d}, 33);
  Tensor pos = Tensor::from_ints({0, 1, 2, 0, 1, 5}, {b * s});
  Tensor inv = Tensor::from_floats(cpu::rope_inv_freq(d, 10000.0), {d / 2});
  gradcheck(
      [=](const V& v) {
        auto [qr, kr] = ag::rope_qk(v[0], v[1], pos, inv);
        // q's four heads summed in pairs onto k's two, so every output reaches the result.
        Variable q_pairs = ag::add(ag::narrow(qr, 2, 0, 2), ag::narrow(qr, 2, 2, 2));
        return ag::add(ag::mul(kr, Variable(c)), q_pairs);
      },
      {q, k});
}

TEST(GradCheck, Rope) {
  const int64_t b = 2, s = 3, h = 2, d = 8;
  auto x = random_f64({b, s, h, d}, 16);
  Tensor pos = Tensor::from_ints({0, 1, 2, 0, 1, 5}, {b * s});
  Tensor inv = Tensor::from_floats(cpu::rope_inv_freq(d, 10000.0), {d / 2});
  gradcheck([=](const V& v) { return ag::rope(v[0], pos, inv); }, {x});
}

// Partial rotary (6 of 8 dims, Phi-4-mini's shape of rotation) with LongRoPE's scaled cos and sin.
TEST(GradCheck, RopePartialAndScaled) {
  const int64_t b = 2, s = 3, h = 2, d = 8;
  auto x = random_f64({b, s, h, d}, 17);
  Tensor pos = Tensor::from_ints({0, 1, 2, 0, 1, 5}, {b * s});
  Tensor inv = Tensor::from_floats(cpu::rope_inv_freq(6, 10000.0), {3});
  gradcheck([=](const V& v) { return ag::rope(v[0], pos, inv, 1.25f); }, {x});
}

// A fused projection's output cut into q/k/v-like parts (Phi-3's qkv_proj), each used differently,
// and one part unused (its gradient slot is zeros).
TEST(GradCheck, SplitLastDim) {
  auto x = random_f64({2, 3, 9}, 18), c = random_f64({2, 3, 4}, 19);
  gradcheck(
      [=](const V& v) {
        std::vector<Variable> p = ag::split(v[0], {4, 4, 1});
        return ag::add(ag::mul(p[0], Variable(c)), ag::mul(p[1], p[1]));
      },
      {x});
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

// rope and attention as one node (q's rope backward inside attention's): against finite differences
// in f64, whole and partial rotation (6 of 8, LongRoPE's mscale), grouped heads, a window.
TEST(GradCheck, RopeAttention) {
  const int64_t b = 2, s = 5, d = 8;
  Tensor pos = Tensor::from_ints({0, 1, 2, 3, 4, 3, 4, 5, 6, 7}, {b * s});
  for (int rot : {8, 6}) {
    SCOPED_TRACE(testing::Message() << "rotary_dim " << rot);
    auto q = random_f64({b, s, 4, d}, 41, -2, 2), k = random_f64({b, s, 2, d}, 42, -2, 2);
    auto v = random_f64({b, s, 2, d}, 43);
    const ops::RopeArgs rope{pos, Tensor::from_floats(cpu::rope_inv_freq(rot, 10000.0), {rot / 2}),
                             rot == 8 ? 1.f : 1.25f};
    ops::AttentionOptions opt;
    opt.window = rot == 8 ? 0 : 3;
    gradcheck([=](const V& x) { return ag::rope_attention(x[0], x[1], x[2], rope, opt); }, {q, k, v});
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

TEST(GradCheck, CheckpointRecordsWeightsItCaptures) {
  // The input needs no gradient (a frozen embedding's output); the weight fn captures does.
  const Tensor x = random_f64({2, 3, 4}, 30);
  auto w = random_f64({5, 4}, 31);
  for (bool offload : {false, true}) {
    gradcheck(
        [=](const V& v) {
          Variable wv = v[0];
          auto fn = [wv](const V& in) { return V{ag::swiglu(ag::linear(in[0], wv), ag::linear(in[0], wv))}; };
          return ag::checkpoint(fn, {Variable(x)}, {.offload = offload, .captures_trainable = true})[0];
        },
        {w});
  }
  // Without the flag nothing is recorded: no input requires grad.
  Variable wv(w, true);
  Variable y = ag::checkpoint([wv](const V& in) { return V{ag::linear(in[0], wv)}; }, {Variable(x)})[0];
  EXPECT_FALSE(y.requires_grad());
}

TEST(GradCheck, LoraLinearEveryInputWithAndWithoutDropout) {
  auto x = random_f64({2, 3, 6}, 40), w = random_f64({5, 6}, 41), a = random_f64({2, 6}, 42), b = random_f64({5, 2}, 43);
  for (float p : {0.f, 0.3f}) {
    const ag::LoraArgs args{0.75f, p, 7, 11};
    gradcheck([=](const V& v) { return ag::lora_linear(v[0], v[1], v[2], v[3], args); }, {x, w, a, b});
    // LoRA proper: the base weight frozen; and with a bias (Qwen2's q/k/v).
    gradcheck([=](const V& v) { return ag::lora_linear(v[0], v[1], v[2], v[3], args); }, {x, w, a, b},
              {true, false, true, true});
    auto bias = random_f64({5}, 49);
    gradcheck([=](const V& v) { return ag::lora_linear(v[0], v[1], v[2], v[3], args, &v[4]); }, {x, w, a, b, bias},
              {true, false, true, true, true});
  }
}

TEST(GradCheck, LoraLinearWithItsInputComputedAgainInBackward) {
  // down_proj's adapter as the MLP runs it: x = swiglu(gate, up) is not kept, backward computes it
  // again from gate and up (models/layers.cpp); finite differences through every input, with and
  // without dropout, base weight trained and frozen.
  auto gate = random_f64({2, 3, 6}, 60), up = random_f64({2, 3, 6}, 61), w = random_f64({5, 6}, 62),
       a = random_f64({2, 6}, 63), b = random_f64({5, 2}, 64);
  for (float p : {0.f, 0.3f}) {
    const ag::LoraArgs args{0.75f, p, 7, 11};
    auto f = [=](const V& v) {
      ag::InputFn again = [g = v[0].value(), u = v[1].value()] { return ops::swiglu(g, u); };
      return ag::lora_linear(ag::swiglu(v[0], v[1]), v[2], v[3], v[4], args, nullptr, {}, again);
    };
    gradcheck(f, {gate, up, w, a, b});
    gradcheck(f, {gate, up, w, a, b}, {true, true, false, true, true});
  }
}

TEST(GradCheck, LoraLinearEqualsItsComposition) {
  // The fused function against the same model written with separate differentiable calls (PEFT's
  // formulation): forward values and every gradient, in f64.
  auto x = random_f64({4, 6}, 44), w = random_f64({5, 6}, 45), a = random_f64({3, 6}, 46), b = random_f64({5, 3}, 47);
  for (float p : {0.f, 0.25f}) {
    const ag::LoraArgs args{1.5f, p, 3, 5};
    V fused{Variable(x.clone(), true), Variable(w.clone(), true), Variable(a.clone(), true), Variable(b.clone(), true)};
    V plain{Variable(x.clone(), true), Variable(w.clone(), true), Variable(a.clone(), true), Variable(b.clone(), true)};
    const Tensor g = random_f64({4, 5}, 48);
    // backward() consumes the whole tape: one model at a time.
    Variable yf = ag::lora_linear(fused[0], fused[1], fused[2], fused[3], args);
    ag::backward(yf, g);
    Variable yp = ag::add(ag::linear(plain[0], plain[1]),
                          ag::scale(ag::linear(ag::linear(ag::dropout(plain[0], p, 3, 5), plain[2]), plain[3]), 1.5f));
    ag::backward(yp, g);
    expect_close(yf.value().to_doubles(), yp.value().to_doubles(), 1e-12, 1e-12, "forward");
    for (size_t i = 0; i < 4; ++i)
      expect_close(fused[i].grad().to_doubles(), plain[i].grad().to_doubles(), 1e-12, 1e-12, "gradient " + std::to_string(i));
  }
}

}  // namespace
}  // namespace loom::test
