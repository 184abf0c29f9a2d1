// lora_linear's residual (the MLP's h, read as the first GEMM's C) checked on every bf16 path on one
// device: the adapter's product first (fewer tokens than outputs: the residual its GEMM's C; more: dx
// through the merged weight), the one GEMM with 3r spare columns (a bias riding along or not), and a
// bias without room (added after). y = residual + the product within bf16's rounding of f64's, and the
// product's and adapter's shares (y less the residual, less the base too) as close to f64's as the add
// apart gets them in bf16 (both round y at the residual's magnitude); the residual's gradient is dy's
// bits, every other gradient as in f64. Spare columns hold NaN until written. Shared by
// test_fn_lora_bf16.cpp (CPU) and test_fn_lora_cuda.cpp.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "autograd/functions.h"
#include "tests/autograd/gradcheck.h"

namespace loom::test {

inline void check_lora_residual(Device device, int64_t n, int64_t in, int64_t out, int64_t r, bool spare,
                                bool with_bias) {
  using ag::Variable;
  const Tensor x = bf16_values({n, in}, 51, 1.0), w = bf16_values({out, in}, 52, 0.1);
  const Tensor a = bf16_values({r, in}, 53, 0.1), b = bf16_values({out, r}, 54, 0.1), dy = bf16_values({n, out}, 55, 1.0);
  const Tensor bias = bf16_values({out}, 56, 1.0), res = bf16_values({n, out}, 57, 1.0);
  const int64_t ext = spare ? 3 * r + (with_bias ? 1 : 0) : 0;
  auto with_room = [&](const Tensor& t) {  // t in bf16 on the device, rows ext wider (NaN there)
    Tensor v = Tensor::full({t.size(0), t.size(1) + ext}, NAN, DType::bf16, device).narrow(1, 0, t.size(1));
    ops::copy_rows_(v, t.to(DType::bf16).to(device));
    return v;
  };
  struct Out {
    Tensor y, dx, da, db, dres;
  };
  auto run = [&](bool f64, bool folded) {
    auto on = [&](const Tensor& t) { return f64 ? t : t.to(DType::bf16).to(device); };
    Variable xv(f64 ? x : with_room(x), true), wv(f64 ? w : with_room(w), false);
    Variable av(f64 ? a : a.to(DType::f32).to(device), true), bv(f64 ? b : b.to(DType::f32).to(device), true);
    Variable biasv(on(bias), false), rv(on(res), true);
    const ag::LoraArgs args{2.f, 0.f, 0, 0, f64 ? 0 : ext, f64 ? 0 : ext};
    const Variable* bp = with_bias ? &biasv : nullptr;
    const Variable y = folded ? ag::lora_linear(xv, wv, av, bv, args, bp, {}, {}, ag::OutputUse::kRead, &rv)
                              : ag::add(rv, ag::lora_linear(xv, wv, av, bv, args, bp));
    const Tensor yv = y.value().to(Device::cpu());
    ag::backward(y, on(dy));
    auto cpu = [](const Tensor& t) { return t.to(Device::cpu()); };
    return Out{yv, cpu(xv.grad()), cpu(av.grad()), cpu(bv.grad()), cpu(rv.grad())};
  };
  const Out ref = run(true, false);  // f64 on the CPU: the reference
  const Out got = run(false, true), apart = run(false, false);
  const std::string what = std::to_string(n) + " tokens, " + (spare ? "one GEMM" : "two products") +
                           (with_bias ? ", bias" : "");
  EXPECT_LT(rel_err(got.y, ref.y), 1e-2) << what;
  Tensor base = ops::add(ops::matmul(x, w, false, true), res);
  if (with_bias) base = ops::add_bias(base, bias);
  auto share_err = [&](const Out& g, const Tensor& less) {
    return rel_err(ops::sub(g.y.to(DType::f64), less), ops::sub(ref.y, less));
  };
  EXPECT_LT(share_err(got, res), 1.5 * share_err(apart, res) + 1e-3) << what << ": the product's share";
  EXPECT_LT(share_err(got, base), 1.5 * share_err(apart, base) + 1e-3) << what << ": the adapter's share";
  EXPECT_EQ(got.dres.to_floats(), dy.to(DType::bf16).to_floats()) << what;
  EXPECT_LT(rel_err(got.dx, ref.dx), 1e-2) << what;
  EXPECT_LT(rel_err(got.da, ref.da), 1e-2) << what;
  EXPECT_LT(rel_err(got.db, ref.db), 1e-2) << what;
}

}  // namespace loom::test
