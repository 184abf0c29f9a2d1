// Every ops:: function through the engine's dispatch on CUDA against the same call on the CPU,
// in f32 and bf16 (in the spirit of ggml's test-backend-ops): one table of cases, one loop.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>

#include "engine/ops.h"
#include "kernels/adamw.h"
#include "kernels/rope.h"

namespace loom::test {
namespace {

// Random inputs are made once on the CPU in f32, then cast/moved, so both backends see the same values.
struct Inputs {
  uint32_t seed = 1;
  Tensor randn(const Shape& s, float lo = -1.f, float hi = 1.f) {
    std::mt19937 gen(seed++);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(numel_of(s));
    for (auto& x : v) x = d(gen);
    return Tensor::from_floats(v, s);
  }
};

using Case = std::function<std::vector<Tensor>(Device, DType)>;

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

void check(const char* name, const Case& c) {
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<Tensor> ref = c(Device::cpu(), dt), got = c(Device::cuda(0), dt);
    ASSERT_EQ(ref.size(), got.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(got[i].is_cuda()) << name << " output " << i << " left the GPU";
      EXPECT_EQ(got[i].shape(), ref[i].shape()) << name;
      // f32: summation order only (1e-5). bf16: one output rounding (2^-9) plus bf16 inputs to
      // intermediate products: 1e-2.
      const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
      EXPECT_LT(rel_l2(got[i].to_floats(), ref[i].to_floats()), tol) << name << " " << loom::name(dt) << " output " << i;
    }
  }
}

#define LOOM_REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

TEST(OpsCuda, ElementwiseAndReductions) {
  LOOM_REQUIRE_CUDA();
  Inputs in;
  Tensor a = in.randn({37, 129}), b = in.randn({37, 129}), bias = in.randn({129});
  check("axpby/mul/scale/add_bias", [&](Device d, DType t) {
    Tensor x = a.to(d, t), y = b.to(d, t);
    Tensor acc = x.clone();
    ops::add_(acc, y);
    return std::vector<Tensor>{ops::axpby(x, y, 0.5f, -1.5f), ops::mul(x, y), ops::scale(x, 3.f),
                               ops::add_bias(x, bias.to(d, t)), acc, ops::sum_rows(x, DType::f32),
                               ops::sum_squares(x), x.transpose(0, 1).contiguous(), ops::softcap(x, 0.7f),
                               ops::softcap_backward(x, y, 0.7f)};
  });
}

TEST(OpsCuda, MatmulShapes) {
  LOOM_REQUIRE_CUDA();
  Inputs in;
  Tensor a = in.randn({3, 33, 17}), b = in.randn({17, 65}), bt = in.randn({65, 17}), bb = in.randn({3, 17, 65});
  check("matmul", [&](Device d, DType t) {
    return std::vector<Tensor>{ops::matmul(a.to(d, t), b.to(d, t)), ops::matmul(a.to(d, t), bt.to(d, t), false, true),
                               ops::matmul(a.to(d, t), bb.to(d, t)), ops::linear(a.to(d, t), bt.to(d, t), DType::f32)};
  });
  // Column slices (rows contiguous, a wider row stride) go in with their stride as the leading dimension.
  Tensor wide = in.randn({48, 96}), wide_t = in.randn({40, 144});
  check("matmul of column slices", [&](Device d, DType t) {
    const Tensor s = wide.to(d, t).narrow(1, 32, 64);                         // [48, 64], row stride 96
    const Tensor u = wide_t.to(d, t).narrow(1, 48, 48), v = wide_t.to(d, t).narrow(1, 0, 48);  // [40, 48], 144
    // Odd offsets and row strides (2-byte aligned in bf16): the LoRA path's [hi, lo] slice at odd ranks.
    const Tensor o = wide.to(d, t).narrow(1, 1, 45), p = wide_t.to(d, t).narrow(1, 3, 45);  // strides 96, 144
    const Tensor q = wide.to(d, t).narrow(0, 0, 45).narrow(1, 5, 31);                          // [45, 31], 96
    return std::vector<Tensor>{ops::matmul(s, s, true, false), ops::matmul(u, v, false, true), ops::matmul(o, q),
                               ops::matmul(p, o, false, true)};
  });
}

TEST(OpsCuda, NormRopeActivationsEmbedding) {
  LOOM_REQUIRE_CUDA();
  Inputs in;
  Tensor x = in.randn({2, 5, 3, 16}), w = in.randn({16}, 0.5f, 1.5f), dy = in.randn({2, 5, 3, 16});
  Tensor table = in.randn({50, 24});
  Tensor ids = Tensor::from_ints({3, 49, 0, 7, 3, 12}, {2, 3});
  Tensor pos = Tensor::from_ints({0, 1, 2, 3, 4, 0, 1, 2, 0, 1}, {10});
  check("rms_norm/rope/glu/embedding", [&](Device d, DType t) {
    Tensor xd = x.to(d, t), wd = w.to(d, t), dyd = dy.to(d, t);
    ops::RmsNormOut r = ops::rms_norm(xd, wd, 1e-6f, false);
    Tensor dw = Tensor::zeros({16}, DType::f32, d);
    Tensor dx = ops::rms_norm_backward(xd, wd, r.rstd, dyd, &dw, true);
    Tensor inv = ops::rope_inv_freq(16, 10000.0, d);
    Tensor pd = pos.to(d);
    auto [dg, du] = ops::swiglu_backward(xd, dyd, xd);
    auto [eg, eu] = ops::geglu_backward(xd, dyd, xd);
    Tensor dtable = Tensor::zeros({50, 24}, DType::f32, d);
    Tensor emb_out = ops::embedding(ids.to(d), table.to(d, t));
    ops::embedding_backward(ids.to(d), emb_out, dtable);
    // Partial rotary (12 of 16 dims) with LongRoPE's cos/sin scaling, as Phi-4-mini and Phi-3.5 use.
    Tensor part = ops::rope_inv_freq(12, 10000.0, d);
    auto [pq, pk] = ops::rope_pair(xd, dyd, pd, part, false, 1.19f);
    auto [gq, gk] = ops::rope_pair(xd, dyd, pd, part, true, 1.19f);
    return std::vector<Tensor>{r.y, r.rstd, dx, dw, ops::rope(xd, pd, inv), ops::rope_backward(dyd, pd, inv),
                               ops::swiglu(xd, dyd), dg, du, ops::geglu(xd, dyd), eg, eu, emb_out, dtable,
                               ops::rope(xd, pd, part, 1.19f), ops::rope_backward(dyd, pd, part, 1.19f), pq, pk, gq, gk};
  });
}

// The residual add fused into RMSNorm (forward) and the residual gradient into its backward: on
// CUDA the same bits as the unfused add / rms_norm / rms_norm_backward / add on CUDA, and close to
// the CPU (the table's tolerances). 2048 columns take the vector path, 13 the scalar one.
TEST(OpsCuda, AddRmsNormEqualsTheUnfusedOps) {
  LOOM_REQUIRE_CUDA();
  Inputs in;
  for (int64_t cols : {int64_t(2048), int64_t(13)}) {
    Tensor x = in.randn({6, cols}), r = in.randn({6, cols}), w = in.randn({cols}, 0.5f, 1.5f);
    Tensor dy = in.randn({6, cols}), dres = in.randn({6, cols});
    auto fused = [&](Device d, DType t) {
      ops::AddRmsNormOut o = ops::add_rms_norm(x.to(d, t), r.to(d, t), w.to(d, t), 1e-6f, false);
      Tensor dw = Tensor::zeros({cols}, DType::f32, d);
      const Tensor dr = dres.to(d, t);
      Tensor dx = ops::rms_norm_backward(o.h, w.to(d, t), o.rstd, dy.to(d, t), &dw, false, &dr);
      return std::vector<Tensor>{o.h, o.y, o.rstd, dx, dw};
    };
    auto unfused = [&](Device d, DType t) {
      Tensor h = ops::add(x.to(d, t), r.to(d, t));
      ops::RmsNormOut n = ops::rms_norm(h, w.to(d, t), 1e-6f, false);
      Tensor dw = Tensor::zeros({cols}, DType::f32, d);
      Tensor dx = ops::add(dres.to(d, t), ops::rms_norm_backward(h, w.to(d, t), n.rstd, dy.to(d, t), &dw, false));
      return std::vector<Tensor>{h, n.y, n.rstd, dx, dw};
    };
    check("add_rms_norm", fused);
    for (DType t : {DType::f32, DType::bf16}) {
      const std::vector<Tensor> a = fused(Device::cuda(0), t), b = unfused(Device::cuda(0), t);
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_EQ(a[i].to_floats(), b[i].to_floats()) << "output " << i << " " << loom::name(t) << " cols " << cols;
    }
  }
}

// Pitched copies (cuda::copy_2d) through cat_last and copy_rows_: the CPU's values, with 16-byte
// aligned rows (bf16 widths 2048 + 48) and unaligned ones (widths 13 + 3, a narrow starting mid-row).
TEST(OpsCuda, PitchedCopiesMatchTheCpu) {
  LOOM_REQUIRE_CUDA();
  Inputs in;
  const Tensor a = in.randn({40, 2048}), b = in.randn({40, 48}), c = in.randn({7, 13}), e = in.randn({7, 3});
  check("cat_last/copy_rows_", [&](Device d, DType t) {
    Tensor wide = Tensor::zeros({7, 21}, t, d);
    Tensor mid = wide.narrow(1, 5, 13);
    ops::copy_rows_(mid, c.to(d, t));
    return std::vector<Tensor>{ops::cat_last({a.to(d, t), b.to(d, t)}, {2048, 48}),
                               ops::cat_last({c.to(d, t), Tensor(), e.to(d, t)}, {13, 2, 3}), wide};
  });
}

// Spare columns after the norm's output rows (for the one-GEMM LoRA product): the same bits as
// without, on the vector path (2048 columns, spare 48) and the scalar one (13 columns, rows 21 apart).
TEST(OpsCuda, NormWithSpareColumnsEqualsWithout) {
  LOOM_REQUIRE_CUDA();
  Inputs in;
  for (int64_t cols : {int64_t(2048), int64_t(13)}) {
    const Tensor x = in.randn({6, cols}), r = in.randn({6, cols}), w = in.randn({cols}, 0.5f, 1.5f);
    for (DType t : {DType::f32, DType::bf16}) {
      const Device d = Device::cuda(0);
      const int64_t spare = cols == 13 ? 8 : 48;
      const ops::RmsNormOut a = ops::rms_norm(x.to(d, t), w.to(d, t), 1e-6f, true);
      const ops::RmsNormOut b = ops::rms_norm(x.to(d, t), w.to(d, t), 1e-6f, true, spare);
      EXPECT_EQ(b.y.strides()[0], cols + spare);
      EXPECT_EQ(b.y.to_floats(), a.y.to_floats()) << loom::name(t) << " cols " << cols;
      const ops::AddRmsNormOut c = ops::add_rms_norm(x.to(d, t), r.to(d, t), w.to(d, t), 1e-6f, false);
      const ops::AddRmsNormOut e = ops::add_rms_norm(x.to(d, t), r.to(d, t), w.to(d, t), 1e-6f, false, spare);
      EXPECT_EQ(e.y.to_floats(), c.y.to_floats()) << loom::name(t) << " cols " << cols;
      EXPECT_EQ(e.h.to_floats(), c.h.to_floats());
    }
  }
}

// q and k rotated in one launch: the bits of two separate ropes, forward and backward, with
// different head counts (grouped-query), and one of the two absent in backward.
TEST(OpsCuda, RopePairEqualsTwoRopes) {
  LOOM_REQUIRE_CUDA();
  Inputs in;
  Tensor q = in.randn({2, 5, 4, 16}), k = in.randn({2, 5, 2, 16});
  Tensor pos = Tensor::from_ints({0, 1, 2, 3, 4, 0, 1, 2, 0, 9}, {10});
  for (DType t : {DType::f32, DType::bf16}) {
    const Device d = Device::cuda(0);
    Tensor inv = ops::rope_inv_freq(16, 10000.0, d), pd = pos.to(d);
    Tensor qd = q.to(d, t), kd = k.to(d, t);
    for (bool backward : {false, true}) {
      auto [a, b] = ops::rope_pair(qd, kd, pd, inv, backward);
      const Tensor ra = backward ? ops::rope_backward(qd, pd, inv) : ops::rope(qd, pd, inv);
      const Tensor rb = backward ? ops::rope_backward(kd, pd, inv) : ops::rope(kd, pd, inv);
      EXPECT_EQ(a.to_floats(), ra.to_floats()) << loom::name(t) << " backward " << backward;
      EXPECT_EQ(b.to_floats(), rb.to_floats()) << loom::name(t) << " backward " << backward;
    }
    auto [only_q, none] = ops::rope_pair(qd, Tensor(), pd, inv, true);
    EXPECT_FALSE(none.defined());
    EXPECT_EQ(only_q.to_floats(), ops::rope_backward(qd, pd, inv).to_floats());
  }
}

TEST(OpsCuda, AttentionAndCrossEntropy) {
  LOOM_REQUIRE_CUDA();
  Inputs in;
  Tensor q = in.randn({2, 9, 4, 32}), k = in.randn({2, 9, 2, 32}), v = in.randn({2, 9, 2, 32}), dout = in.randn({2, 9, 4, 32});
  Tensor logits = in.randn({7, 301}, -4.f, 4.f), dloss = in.randn({7});
  Tensor targets = Tensor::from_ints({0, 300, -100, 5, 17, -100, 299}, {7});
  Tensor seg = Tensor::from_ints({0, 0, 0, 1, 1, 1, 1, 2, 2, 0, 0, 0, 0, 0, 1, 1, 1, 1}, {2, 9});
  check("attention/cross_entropy", [&](Device d, DType t) {
    std::vector<Tensor> outs;
    for (int variant = 0; variant < 3; ++variant) {
      ops::AttentionOptions opt;
      if (variant == 1) { opt.window = 4; opt.softcap = 5.f; }
      if (variant == 2) opt.segment_ids = seg.to(d);
      ops::AttentionOut a = ops::attention(q.to(d, t), k.to(d, t), v.to(d, t), opt);
      ops::AttentionGrads g = ops::attention_backward(q.to(d, t), k.to(d, t), v.to(d, t), a.out, dout.to(d, t), a.lse, opt);
      outs.insert(outs.end(), {a.out, a.lse, g.dq, g.dk, g.dv});
    }
    ops::CrossEntropyOut ce = ops::cross_entropy(logits.to(d, t), targets.to(d), 30.f);
    outs.insert(outs.end(), {ce.loss, ce.lse,
                             ops::cross_entropy_backward(logits.to(d, t), targets.to(d), ce.lse, dloss.to(d), 30.f)});
    return outs;
  });
}

// attention_backward returning q's gradient before its rope (ag::rope_attention's): on the GPU's flash
// path at head_dim 64 and 128 (rope in the pass that finishes dq), a partial rotation there (rope after),
// head_dim 12 (the row kernels, rope after) and f32; against the CPU's attention backward then rope's.
TEST(OpsCuda, AttentionBackwardThroughQsRope) {
  LOOM_REQUIRE_CUDA();
  struct Shape4 {
    int64_t head_dim, rotary_dim;
  };
  for (const Shape4 c : {Shape4{64, 64}, Shape4{128, 128}, Shape4{64, 48}, Shape4{12, 12}}) {
    Inputs in;
    const int64_t b = 2, s = 70;
    Tensor q = in.randn({b, s, 4, c.head_dim}), k = in.randn({b, s, 2, c.head_dim}), v = in.randn({b, s, 2, c.head_dim});
    Tensor dout = in.randn({b, s, 4, c.head_dim});
    std::vector<int32_t> positions;
    for (int64_t r = 0; r < b; ++r)
      for (int64_t i = 0; i < s; ++i) positions.push_back(static_cast<int32_t>(i + 37 * r));
    const Tensor pos = Tensor::from_ints(positions, {b * s});
    const std::string name = "attention_backward rope_q head_dim " + std::to_string(c.head_dim) + " rotary " +
                             std::to_string(c.rotary_dim);
    check(name.c_str(), [&](Device d, DType t) {
      const ops::RopeArgs rope{pos.to(d), ops::rope_inv_freq(c.rotary_dim, 10000.0, d), 1.f};
      ops::AttentionOptions opt;
      ops::AttentionOut a = ops::attention(q.to(d, t), k.to(d, t), v.to(d, t), opt);
      ops::AttentionGrads g =
          ops::attention_backward(q.to(d, t), k.to(d, t), v.to(d, t), a.out, dout.to(d, t), a.lse, opt, &rope);
      return std::vector<Tensor>{g.dq, g.dk, g.dv};
    });
  }
}

TEST(OpsCuda, AdamWAndRandomFills) {
  LOOM_REQUIRE_CUDA();
  Inputs in;
  Tensor p0 = in.randn({1000}), g = in.randn({1000});
  check("adamw/fills", [&](Device d, DType t) {
    // clone: on the CPU to() returns p0 itself, which the step would update in place.
    Tensor p = p0.to(d).clone(), m = Tensor::zeros({1000}, DType::f32, d), v = Tensor::zeros({1000}, DType::f32, d);
    Tensor copy = Tensor::empty({1000}, DType::bf16, d);
    AdamWParams ap;
    ap.lr = 1e-2f;
    for (int s = 1; s <= 3; ++s) {
      ap.step = s;
      ops::adamw_step(p, g.to(d, t), m, v, ap, &copy);
    }
    Tensor u = Tensor::empty({999}, t, d), n = Tensor::empty({999}, t, d);
    ops::uniform_(u, 7, 100, -2.f, 3.f);
    ops::normal_(n, 7, 200, 1.f, 0.5f);
    return std::vector<Tensor>{p, m, v, copy, u, n, ops::dropout(g.to(d, t), 0.25f, 3, 17)};
  });
}

// Running out of device memory is a loom::OutOfMemoryError that names the request, what Loom
// holds and what else holds the card; the allocator keeps working afterwards.
TEST(OpsCuda, OutOfMemoryIsAClearError) {
  LOOM_REQUIRE_CUDA();
  const Shape huge{int64_t(1) << 38, 1024};  // 1 PiB of f32: more than any card
  try {
    Tensor t = Tensor::empty(huge, DType::f32, Device::cuda(0));
    FAIL() << "a 1 PiB allocation succeeded";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("allocating 1048576.00 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("Loom holds"), std::string::npos) << m;
    EXPECT_NE(m.find("other processes on this GPU"), std::string::npos) << m;
  }
  Tensor ok = Tensor::zeros({1024}, DType::f32, Device::cuda(0));
  EXPECT_EQ(ok.to(Device::cpu()).to_floats()[0], 0.f);
}

}  // namespace
}  // namespace loom::test
