// lora_linear in bf16 (the hi + lo split adapter path, kernels/bf16_split.h) on the CPU against
// the same function in f64 on the same bf16-rounded values: output, dx, dA and dB, with the adapter's
// product written first and the base GEMM added onto it (bf16 without bias: autograd/fn_lora.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "autograd/functions.h"
#include "autograd/lora_split.h"
#include "tests/autograd/gradcheck.h"
#include "tests/autograd/lora_residual_check.h"

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
  // dx's adapter share likewise (with more tokens than outputs it comes through W + s B A, rounded
  // with W: half an ulp of W, about 1 % of the share at these magnitudes).
  const Tensor dx_base = ops::matmul(dy, w);
  EXPECT_LT(rel_err(ops::sub(got.dx.to(DType::f64), dx_base), ops::sub(ref.dx, dx_base)), 3e-2);
}

TEST(LoraBf16, MatchesF64OnTheSameValues) {
  check(37, 48, 40, 4);
  check(64, 32, 96, 16);
}

// More tokens than outputs: dx = dy (W + s B A), one product (autograd/lora_split.h's merge_for_dx).
TEST(LoraBf16, DxThroughTheMergedWeightMatchesF64) {
  check(96, 48, 40, 4);
  check(160, 32, 96, 16);
}

// dx through the merged weight added onto what x's other reader gave (grad_so_far, beta 1): two products
// of one x with different scales (no lora_linears), more tokens than either's outputs, against f64.
TEST(LoraBf16, MergedDxAddsOntoAnotherReadersGradient) {
  const int64_t n = 96, in = 48, r = 4;
  const Tensor x = bf16_values({n, in}, 31, 1.0);
  std::vector<Tensor> w, a, b, dy;
  for (uint32_t i = 0; i < 2; ++i) {
    const int64_t out = i ? 24 : 40;
    w.push_back(bf16_values({out, in}, 32 + 10 * i, 0.1)), a.push_back(bf16_values({r, in}, 33 + 10 * i, 0.1));
    b.push_back(bf16_values({out, r}, 34 + 10 * i, 0.1)), dy.push_back(bf16_values({n, out}, 35 + 10 * i, 1.0));
  }
  auto run = [&](DType dt) {
    Variable xv(x.to(dt), true);
    std::vector<Variable> ys, av, bv;
    for (size_t i = 0; i < 2; ++i) {
      av.emplace_back(dt == DType::f64 ? a[i] : a[i].to(DType::f32), true);
      bv.emplace_back(dt == DType::f64 ? b[i] : b[i].to(DType::f32), true);
    }
    for (size_t i = 0; i < 2; ++i)
      ys.push_back(ag::lora_linear(xv, Variable(w[i].to(dt), false), av[i], bv[i], ag::LoraArgs{i ? 0.5f : 2.f, 0.f, 0, 0}));
    ag::backward(ys, {dy[0].to(dt), dy[1].to(dt)});
    return xv.grad();
  };
  const Tensor ref = run(DType::f64), got = run(DType::bf16);
  EXPECT_LT(rel_err(got, ref), 1e-2);
  const Tensor base = ops::add(ops::matmul(dy[0], w[0]), ops::matmul(dy[1], w[1]));
  EXPECT_LT(rel_err(ops::sub(got.to(DType::f64), base), ops::sub(ref, base)), 3e-2) << "the adapters' share of dx";
}

// merged_weight on its own: W + s B A from B's [hi, lo, hi] and A's [hi; hi; lo] parts against f64, laid
// out with W's row pitch (W with spare columns, as Linear::widen_for_adapter leaves it), W untouched.
TEST(LoraBf16, MergedWeightIsWPlusScaledBA) {
  const int64_t out = 40, in = 48, r = 4, spare = 13;
  const Tensor w = bf16_values({out, in}, 21, 0.1), a = bf16_values({r, in}, 22, 0.1), b = bf16_values({out, r}, 23, 0.1);
  Tensor w_wide = Tensor::full({out, in + spare}, NAN, DType::bf16).narrow(1, 0, in);
  ops::copy_rows_(w_wide, w.to(DType::bf16));
  const Tensor b_parts = ops::bf16_split(b.to(DType::f32), "hhlh");
  const Tensor a_hhl = ag::detail::split_rows(a.to(DType::f32), "hhl");
  const Tensor merged = ag::detail::merged_weight(w_wide, b_parts.narrow(1, r, 3 * r), a_hhl, 2.f);
  EXPECT_EQ(merged.shape(), w.shape());
  EXPECT_EQ(merged.strides()[0], in + spare);
  const Tensor ref = ops::add(w, ops::scale(ops::matmul(b, a), 2.0));
  // One bf16 rounding of the sum (2^-9 relative), the adapter's parts exact to ~16 bits.
  EXPECT_LT(rel_err(merged.contiguous(), ref), 4e-3);
  const Tensor delta = ops::sub(merged.contiguous().to(DType::f64), w);
  EXPECT_LT(rel_err(delta, ops::sub(ref, w)), 2e-2);  // the share of s B A, under W's half ulp
  EXPECT_EQ(w_wide.contiguous().to_floats(), w.to(DType::bf16).to_floats()) << "W changed";
}

// x as the first `in` columns of rows `in + spare` wide, the spare columns NaN.
Tensor with_spare(const Tensor& x, int64_t spare) {
  Tensor v = Tensor::full({x.size(0), x.size(1) + spare}, NAN, x.dtype()).narrow(1, 0, x.size(1));
  ops::copy_rows_(v, x);
  return v;
}

// With 3r spare columns after x's rows (LoraArgs::x_spare, a norm's output in a model) and after W's
// (LoraArgs::w_spare, Linear::widen_for_adapter), y = [x, t] [W, s B]^T is one GEMM: t's parts land
// in x's spare columns and s B's in W's, W's own columns are untouched, y stays as close to the f64
// function as the two-product path, and backward, which does not read y, gives the same bits. With
// fewer spare columns in x, or none in W, the two products run and x's spare columns stay untouched.
void check_spare(int64_t n, int64_t in, int64_t out, int64_t r, float scale, bool with_bias) {
  const Tensor x = bf16_values({n, in}, 11, 1.0), w = bf16_values({out, in}, 12, 0.1);
  const Tensor a = bf16_values({r, in}, 13, 0.1), b = bf16_values({out, r}, 14, 0.1), dy = bf16_values({n, out}, 15, 1.0);
  const Tensor bias = bf16_values({out}, 16, 1.0);
  const int64_t ext = 3 * r + (with_bias ? 1 : 0);
  struct Got {
    Tensor y, dx, da, db, dbias;
  };
  const Tensor w_wide = with_spare(w.to(DType::bf16), ext);
  auto run = [&](const Tensor& xin, int64_t spare, bool wide_w = false) {
    const DType dt = xin.dtype();
    Variable xv(xin, true), wv(wide_w ? w_wide : w.to(dt), false), biasv(bias.to(dt), true);
    Variable av(dt == DType::f64 ? a : a.to(DType::f32), true), bv(dt == DType::f64 ? b : b.to(DType::f32), true);
    Variable y = ag::lora_linear(xv, wv, av, bv, ag::LoraArgs{scale, 0.f, 0, 0, spare, wide_w ? ext : 0},
                                 with_bias ? &biasv : nullptr);
    const Tensor yv = y.value();
    ag::backward(y, dy.to(dt));
    return Got{yv, xv.grad(), av.grad(), bv.grad(), with_bias ? biasv.grad() : Tensor::zeros({1}, DType::f32)};
  };
  const Got ref = run(x, 0), plain = run(x.to(DType::bf16), 0);
  const Tensor xs = with_spare(x.to(DType::bf16), ext);
  // x with room but W without: the two products, x's spare columns untouched.
  const Got no_w_room = run(xs, ext);
  EXPECT_EQ(no_w_room.y.to_floats(), plain.y.to_floats());
  for (float v : ops::widen_rows(xs, ext).narrow(1, in, ext).contiguous().to_floats()) {
    ASSERT_TRUE(std::isnan(v));
  }
  const Got one = run(xs, ext, true);
  const std::vector<float> tail = ops::widen_rows(xs, ext).narrow(1, in, ext).contiguous().to_floats();
  for (size_t i = 0; i < tail.size(); ++i) {
    ASSERT_FALSE(std::isnan(tail[i])) << "t's parts were not written beside x";
    if (with_bias && int64_t(i % ext) == ext - 1) {
      ASSERT_EQ(tail[i], 1.f) << "the bias's column of ones";
    }
  }
  for (float v : ops::widen_rows(w_wide, ext).narrow(1, in, ext).contiguous().to_floats()) {
    ASSERT_FALSE(std::isnan(v)) << "s B's parts were not written beside W";
  }
  EXPECT_EQ(w_wide.contiguous().to_floats(), w.to(DType::bf16).to_floats()) << "W's own columns changed";
  EXPECT_EQ(one.dx.to_floats(), plain.dx.to_floats());
  EXPECT_EQ(one.da.to_floats(), plain.da.to_floats());
  EXPECT_EQ(one.db.to_floats(), plain.db.to_floats());
  EXPECT_EQ(one.dbias.to_floats(), plain.dbias.to_floats());
  EXPECT_LT(rel_err(one.y, ref.y), 1e-2);
  Tensor base = ops::matmul(x, w, false, true);
  if (with_bias) base = ops::add_bias(base, bias);
  EXPECT_LT(rel_err(ops::sub(one.y.to(DType::f64), base), ops::sub(ref.y, base)), 3e-2);

  const Tensor short_x = with_spare(x.to(DType::bf16), ext - 1);
  const Got two = run(short_x, ext - 1, true);
  EXPECT_EQ(two.y.to_floats(), plain.y.to_floats());
  for (float v : ops::widen_rows(short_x, ext - 1).narrow(1, in, ext - 1).contiguous().to_floats())
    ASSERT_TRUE(std::isnan(v));
}

TEST(LoraBf16, SpareColumnsMakeOneProduct) {
  check_spare(37, 48, 40, 4, 2.f, false);
  check_spare(64, 32, 96, 16, 1.f, false);
  check_spare(80, 48, 40, 4, 2.f, false);  // dx through the merged weight (W read with its pitch)
}

TEST(LoraBf16, SpareColumnsCarryTheBias) {
  check_spare(37, 48, 40, 4, 2.f, true);
  check_spare(64, 32, 96, 16, 1.f, true);
  check_spare(80, 48, 40, 4, 2.f, true);
}

TEST(LoraBf16, AResidualOnEveryPath) {
  for (bool spare : {false, true})
    for (bool with_bias : {false, true}) check_lora_residual(Device::cpu(), 37, 48, 40, 4, spare, with_bias);
}

}  // namespace
}  // namespace loom::test
