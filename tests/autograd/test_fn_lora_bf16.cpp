// lora_linear in bf16 (the hi + lo split adapter path, kernels/bf16_split.h) on the CPU against
// the same function in f64 on the same bf16-rounded values: output, dx, dA and dB, with the adapter's
// product written first and the base GEMM added onto it (bf16 without bias: autograd/fn_lora.cpp).
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "tests/autograd/gradcheck.h"

namespace loom::test {
namespace {

using ag::Variable;

// n tokens, in -> out, rank r. Tolerances: the bf16 path rounds y, dx (bf16 outputs, 2^-9) and
// its adapter operands to ~16 bits; 1e-2 relative L2 for y and dx is bf16's own rounding with
// margin, and A, B's gradients (f32, from bf16 dy and x) 1e-2 as well.
void check(int64_t n, int64_t in, int64_t out, int64_t r) {
  const Tensor x = bf16_values({n, in}, 1, 1.0), w = bf16_values({out, in}, 2, 0.1);
  const Tensor a = bf16_values({r, in}, 3, 0.1), b = bf16_values({out, r}, 4, 0.1), dy = bf16_values({n, out}, 5, 1.0);
  const ag::LoraArgs args{2.f, 0.f, 0, 0};
  struct Got {
    Tensor y, dx, da, db;
  };
  auto run = [&](DType dt) {
    Variable xv(x.to(dt), true), wv(w.to(dt), false);
    Variable av(a.to(DType::f32), true), bv(b.to(DType::f32), true);  // f32 masters, as the trainer keeps them
    if (dt == DType::f64) av = Variable(a, true), bv = Variable(b, true);
    Variable y = ag::lora_linear(xv, wv, av, bv, args);
    const Tensor yv = y.value();
    ag::backward(y, dy.to(dt));
    return Got{yv, xv.grad(), av.grad(), bv.grad()};
  };
  const Got ref = run(DType::f64), got = run(DType::bf16);
  EXPECT_EQ(got.y.dtype(), DType::bf16);
  EXPECT_EQ(got.da.dtype(), DType::f32);
  EXPECT_LT(rel_err(got.y, ref.y), 1e-2);
  EXPECT_LT(rel_err(got.dx, ref.dx), 1e-2);
  EXPECT_LT(rel_err(got.da, ref.da), 1e-2);
  EXPECT_LT(rel_err(got.db, ref.db), 1e-2);
  // The adapter's share of y is small next to the base's: check it on its own too, so that a lost
  // or doubled adapter product cannot hide under the base's rounding.
  const Tensor base = ops::matmul(x, w, false, true);
  EXPECT_LT(rel_err(ops::sub(got.y.to(DType::f64), base), ops::sub(ref.y, base)), 3e-2);
}

TEST(LoraBf16, MatchesF64OnTheSameValues) {
  check(37, 48, 40, 4);
  check(64, 32, 96, 16);
}

}  // namespace
}  // namespace loom::test
