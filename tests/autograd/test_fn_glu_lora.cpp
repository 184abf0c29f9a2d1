// glu_lora_linear (a gated MLP's down projection with its adapter, dA finished in the activation's
// backward) against f64 finite differences, and against the two functions apart (swiglu / geglu,
// then lora_linear with its input computed again in backward, the path it replaces): the same
// values and gradients bit for bit, in f64 and in bf16 (the hi + lo split adapter path).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "autograd/functions.h"
#include "tests/autograd/gradcheck.h"

namespace loom::test {
namespace {

using ag::Variable;
using V = std::vector<Variable>;

TEST(GluLora, FiniteDifferencesThroughGateUpAndTheAdapter) {
  auto gate = random_f64({2, 3, 6}, 70, -3, 3), up = random_f64({2, 3, 6}, 71), w = random_f64({5, 6}, 72),
       a = random_f64({2, 6}, 73), b = random_f64({5, 2}, 74), bias = random_f64({5}, 75);
  const ag::LoraArgs args{0.75f, 0.f, 0, 0};
  for (bool gelu : {false, true}) {
    gradcheck([=](const V& v) { return ag::glu_lora_linear(v[0], v[1], gelu, v[2], v[3], v[4], args); },
              {gate, up, w, a, b}, {true, true, false, true, true});
    gradcheck([=](const V& v) { return ag::glu_lora_linear(v[0], v[1], gelu, v[2], v[3], v[4], args, &v[5]); },
              {gate, up, w, a, b, bias}, {true, true, false, true, true, true});
    // With a residual added (the block's last add, folded into the product's GEMM).
    gradcheck([=](const V& v) { return ag::glu_lora_linear(v[0], v[1], gelu, v[2], v[3], v[4], args, nullptr, {},
                                                            ag::OutputUse::kRead, &v[5]); },
              {gate, up, w, a, b, random_f64({2, 3, 5}, 76)}, {true, true, false, true, true, true});
    // Only the adapter trains (gate and up from frozen layers), and only A or only B.
    gradcheck([=](const V& v) { return ag::glu_lora_linear(v[0], v[1], gelu, v[2], v[3], v[4], args); },
              {gate, up, w, a, b}, {false, false, false, true, false});
    gradcheck([=](const V& v) { return ag::glu_lora_linear(v[0], v[1], gelu, v[2], v[3], v[4], args); },
              {gate, up, w, a, b}, {true, false, false, false, true});
  }
}

struct Result {
  Tensor y, dgate, dup, da, db;
};

struct How {
  bool train_a = true;  // false: A frozen (the activation's plain backward, h not made again)
  bool sole = false;    // gate and up intermediates held by nothing but the activation's node at backward
                        // (as in a model): their gradients are written over them
};

// The MLP's down projection on gate and up in dtype dt: fused (glu_lora_linear) or apart.
Result run(bool fused, bool gelu, DType dt, const Tensor& gate, const Tensor& up, const Tensor& w, const Tensor& a,
           const Tensor& b, const Tensor& dy, How how = {}) {
  Variable g(gate.to(dt), true), u(up.to(dt), true), wv(w.to(dt), false);
  const DType master = dt == DType::f64 ? DType::f64 : DType::f32;  // f32 masters, as the trainer keeps them
  Variable av(a.to(master), how.train_a), bv(b.to(master), true);
  const ag::LoraArgs args{2.f, 0.f, 0, 0};
  Variable y;
  {
    // x 1 is exact: the same values, in tensors only the tape's nodes will hold once this scope ends.
    const Variable gi = how.sole ? ag::scale(g, 1.f) : g, ui = how.sole ? ag::scale(u, 1.f) : u;
    if (fused) {
      y = ag::glu_lora_linear(gi, ui, gelu, wv, av, bv, args);
    } else {
      ag::InputFn again = [gv = gi.value(), uv = ui.value(), gelu] {
        return gelu ? ops::geglu(gv, uv) : ops::swiglu(gv, uv);
      };
      y = ag::lora_linear(gelu ? ag::geglu(gi, ui) : ag::swiglu(gi, ui), wv, av, bv, args, nullptr, {}, again);
    }
  }
  const Tensor yv = y.value();
  ag::backward(y, dy.to(dt));
  return Result{yv, g.grad(), u.grad(), av.grad(), bv.grad()};
}

TEST(GluLora, TheSameBitsAsTheTwoFunctionsApart) {
  const Tensor gate = bf16_values({37, 48}, 1, 2.0), up = bf16_values({37, 48}, 2, 1.0);
  const Tensor w = bf16_values({40, 48}, 3, 0.1), a = bf16_values({4, 48}, 4, 0.1), b = bf16_values({40, 4}, 5, 0.1);
  const Tensor dy = bf16_values({37, 40}, 6, 1.0);
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (bool gelu : {false, true}) {
      const Result f = run(true, gelu, dt, gate, up, w, a, b, dy), p = run(false, gelu, dt, gate, up, w, a, b, dy);
      const std::string what = std::string(name(dt)) + (gelu ? " geglu" : " swiglu");
      EXPECT_EQ(f.y.to_doubles(), p.y.to_doubles()) << what;
      EXPECT_EQ(f.dgate.to_doubles(), p.dgate.to_doubles()) << what;
      EXPECT_EQ(f.dup.to_doubles(), p.dup.to_doubles()) << what;
      EXPECT_EQ(f.da.to_doubles(), p.da.to_doubles()) << what;
      EXPECT_EQ(f.db.to_doubles(), p.db.to_doubles()) << what;
      double largest = 0;  // (a dA of zeros would pass the comparisons above vacuously)
      for (double v : f.da.to_doubles()) largest = std::max(largest, std::abs(v));
      EXPECT_GT(largest, 1e-3) << what;
    }
  }
}

// With a residual: residual + the product, the residual read by the GEMM that writes y first in bf16
// (rounded with the adapter's product, where the add apart rounds after the base's). Its gradient is
// y's; every other gradient the same bits as with the add apart; y within bf16's rounding of f64's.
TEST(GluLora, AResidualAddedInTheProduct) {
  const Tensor gate = bf16_values({37, 48}, 21, 2.0), up = bf16_values({37, 48}, 22, 1.0);
  const Tensor w = bf16_values({40, 48}, 23, 0.1), a = bf16_values({4, 48}, 24, 0.1), b = bf16_values({40, 4}, 25, 0.1);
  const Tensor res = bf16_values({37, 40}, 26, 1.0), dy = bf16_values({37, 40}, 27, 1.0);
  const ag::LoraArgs args{2.f, 0.f, 0, 0};
  struct Got {
    Tensor y, dgate, dup, da, db, dres;
  };
  // folded 0: the add apart; 1: glu_lora_linear's residual; 2: lora_linear's on swiglu's output (the
  // path a layer takes when the activation's backward does not run: the same bits as 1).
  auto run_with = [&](DType dt, int folded) {
    Variable g(gate.to(dt), true), u(up.to(dt), true), wv(w.to(dt), false), rv(res.to(dt), true);
    const DType master = dt == DType::f64 ? DType::f64 : DType::f32;
    Variable av(a.to(master), true), bv(b.to(master), true);
    const Variable y =
        folded == 1   ? ag::glu_lora_linear(g, u, false, wv, av, bv, args, nullptr, {}, ag::OutputUse::kRead, &rv)
        : folded == 2 ? ag::lora_linear(ag::swiglu(g, u), wv, av, bv, args, nullptr, {}, {}, ag::OutputUse::kRead, &rv)
                      : ag::add(rv, ag::glu_lora_linear(g, u, false, wv, av, bv, args));
    const Tensor yv = y.value();
    ag::backward(y, dy.to(dt));
    return Got{yv, g.grad(), u.grad(), av.grad(), bv.grad(), rv.grad()};
  };
  const Got ref = run_with(DType::f64, 0);
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    const Got f = run_with(dt, 1), p = run_with(dt, 0), l = run_with(dt, 2);
    const std::string what(name(dt));
    EXPECT_EQ(l.y.to_doubles(), f.y.to_doubles()) << what << ": lora_linear's residual";
    EXPECT_EQ(l.dres.to_doubles(), f.dres.to_doubles()) << what;
    EXPECT_EQ(l.db.to_doubles(), f.db.to_doubles()) << what;
    if (dt != DType::bf16) {
      EXPECT_EQ(f.y.to_doubles(), p.y.to_doubles()) << what;  // added after, as apart
    }
    EXPECT_LT(rel_err(f.y, ref.y), 1e-2) << what;
    // The product's share on its own (y minus the residual), so a lost or doubled residual or product shows.
    EXPECT_LT(rel_err(ops::sub(f.y.to(DType::f64), res), ops::sub(ref.y, res)), 2e-2) << what;
    EXPECT_EQ(f.dgate.to_doubles(), p.dgate.to_doubles()) << what;
    EXPECT_EQ(f.dup.to_doubles(), p.dup.to_doubles()) << what;
    EXPECT_EQ(f.da.to_doubles(), p.da.to_doubles()) << what;
    EXPECT_EQ(f.db.to_doubles(), p.db.to_doubles()) << what;
    EXPECT_EQ(f.dres.to_doubles(), dy.to(dt).to_doubles()) << what;
  }
}

// A frozen (no dA: the activation's plain backward), and gate and up held by nothing but the
// activation's node (their gradients written over them, as in a model's MLP): still the same bits.
TEST(GluLora, TheSameBitsWithAFrozenAndWithSoleInputs) {
  const Tensor gate = bf16_values({29, 32}, 11, 2.0), up = bf16_values({29, 32}, 12, 1.0);
  const Tensor w = bf16_values({24, 32}, 13, 0.1), a = bf16_values({4, 32}, 14, 0.1), b = bf16_values({24, 4}, 15, 0.1);
  const Tensor dy = bf16_values({29, 24}, 16, 1.0);
  for (DType dt : {DType::f64, DType::bf16}) {
    for (bool gelu : {false, true}) {
      for (How how : {How{false, false}, How{true, true}, How{false, true}}) {
        const Result f = run(true, gelu, dt, gate, up, w, a, b, dy, how), p = run(false, gelu, dt, gate, up, w, a, b, dy, how);
        const std::string what = std::string(name(dt)) + (gelu ? " geglu" : " swiglu") + (how.train_a ? "" : " A frozen") +
                                 (how.sole ? " sole" : "");
        EXPECT_EQ(f.y.to_doubles(), p.y.to_doubles()) << what;
        EXPECT_EQ(f.dgate.to_doubles(), p.dgate.to_doubles()) << what;
        EXPECT_EQ(f.dup.to_doubles(), p.dup.to_doubles()) << what;
        EXPECT_EQ(f.db.to_doubles(), p.db.to_doubles()) << what;
        EXPECT_EQ(f.da.defined(), how.train_a) << what;
        if (how.train_a) {
          EXPECT_EQ(f.da.to_doubles(), p.da.to_doubles()) << what;
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom::test
