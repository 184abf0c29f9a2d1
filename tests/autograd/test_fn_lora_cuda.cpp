// The bf16 LoRA products on CUDA against the same functions in f64 on the CPU, on the same bf16-rounded
// values: lora_linear and lora_linears with fewer tokens than outputs (the adapter's skinny product
// into dx, then the base GEMM adding onto it) and with more (dx through W + s B A: cuBLASLt reading C
// apart from D, then one GEMM; autograd/lora_split.h's merge_for_dx), W with and without spare columns.
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

const Device kGpu = Device::cuda(0);

struct Got {
  std::vector<Tensor> y, da, db;
  Tensor dx;
};

// n tokens, x [n, in], products of outputs outs (rank r each) over x; grouped: one ag::lora_linears
// call (else ag::lora_linear each); spare: W and x with 3r spare columns (the one-GEMM forward).
void check(int64_t n, int64_t in, const std::vector<int64_t>& outs, int64_t r, bool grouped, bool spare) {
  const size_t m = outs.size();
  const int64_t ext = spare ? 3 * r : 0;
  const float scale = 2.f;
  const Tensor x = bf16_values({n, in}, 81, 1.0);
  std::vector<Tensor> w, a, b, dy;
  for (size_t i = 0; i < m; ++i) {
    const uint32_t seed = 90 + 10 * static_cast<uint32_t>(i);
    w.push_back(bf16_values({outs[i], in}, seed, 0.1));
    a.push_back(bf16_values({r, in}, seed + 1, 0.1));
    b.push_back(bf16_values({outs[i], r}, seed + 2, 0.1));
    dy.push_back(bf16_values({n, outs[i]}, seed + 3, 1.0));
  }
  // rows `cols + room` wide on `device`, the first `cols` columns t's, the rest NaN.
  auto with_room = [](const Tensor& t, int64_t room, Device device) {
    Tensor v = Tensor::full({t.size(0), t.size(1) + room}, NAN, DType::bf16, device).narrow(1, 0, t.size(1));
    ops::copy_rows_(v, t.to(DType::bf16).to(device));
    return v;
  };
  auto run = [&](DType dt, Device device) {
    const bool f64 = dt == DType::f64;
    Variable xv(f64 ? x : with_room(x, ext, device), true);
    std::vector<Variable> av, bv;
    for (size_t i = 0; i < m; ++i) {
      av.emplace_back(f64 ? a[i] : a[i].to(DType::f32).to(device), true);
      bv.emplace_back(f64 ? b[i] : b[i].to(DType::f32).to(device), true);
    }
    std::vector<Variable> ys;
    const ag::LoraArgs args{scale, 0.f, 0, 0, f64 ? 0 : ext, f64 ? 0 : ext};
    if (grouped && !f64) {
      std::vector<ag::LoraProduct> products;
      for (size_t i = 0; i < m; ++i) {
        ag::LoraProduct p;
        p.weight = with_room(w[i], ext, device);
        p.a = &av[i], p.b = &bv[i], p.lora = args;
        products.push_back(std::move(p));
      }
      ys = ag::lora_linears(xv, products);
    } else {
      for (size_t i = 0; i < m; ++i)
        ys.push_back(ag::lora_linear(xv, Variable(f64 ? w[i] : with_room(w[i], ext, device), false), av[i], bv[i], args));
    }
    std::vector<Tensor> grads;
    for (size_t i = 0; i < m; ++i) grads.push_back(f64 ? dy[i] : dy[i].to(DType::bf16).to(device));
    ag::backward(ys, grads);
    Got got;
    for (size_t i = 0; i < m; ++i)
      got.y.push_back(ys[i].value().to(Device::cpu())), got.da.push_back(av[i].grad().to(Device::cpu())),
          got.db.push_back(bv[i].grad().to(Device::cpu()));
    got.dx = xv.grad().to(Device::cpu());
    return got;
  };
  const Got ref = run(DType::f64, Device::cpu()), got = run(DType::bf16, kGpu);
  // Tolerances as test_fn_lora_bf16's: bf16 outputs (2^-9), the adapter's operands exact to ~16 bits.
  EXPECT_LT(rel_err(got.dx, ref.dx), 1e-2);
  Tensor dx_base = Tensor::zeros({n, in}, DType::f64);
  for (size_t i = 0; i < m; ++i) dx_base = ops::add(dx_base, ops::matmul(dy[i], w[i]));
  EXPECT_LT(rel_err(ops::sub(got.dx.to(DType::f64), dx_base), ops::sub(ref.dx, dx_base)), 3e-2) << "dx's adapter share";
  for (size_t i = 0; i < m; ++i) {
    SCOPED_TRACE("product " + std::to_string(i));
    EXPECT_LT(rel_err(got.y[i], ref.y[i]), 1e-2);
    const Tensor base = ops::matmul(x, w[i], false, true);
    EXPECT_LT(rel_err(ops::sub(got.y[i].to(DType::f64), base), ops::sub(ref.y[i], base)), 3e-2) << "y's adapter share";
    EXPECT_LT(rel_err(got.da[i], ref.da[i]), 1e-2);
    EXPECT_LT(rel_err(got.db[i], ref.db[i]), 1e-2);
  }
}

TEST(LoraCuda, SkinnyProductIntoDx) {
  check(96, 256, {384}, 16, false, false);
  check(96, 256, {384}, 16, false, true);
  check(200, 256, {256, 64, 64}, 16, true, true);  // the outputs together (384) more than the tokens
}

TEST(LoraCuda, DxThroughTheMergedWeight) {
  check(1000, 256, {384}, 16, false, false);
  check(1000, 256, {384}, 16, false, true);
  check(1000, 256, {256, 64, 64}, 16, true, true);
  check(1000, 264, {128, 32, 32}, 8, true, false);
}

// lora_linear's residual on CUDA (cuBLASLt reading C apart from D), every bf16 path: the adapter's
// product first (96 tokens), dx through the merged weight (1000), the one GEMM with and without a bias.
TEST(LoraCuda, AResidualOnEveryPath) {
  for (int64_t n : {96, 1000})  // adapter first / merged-weight dx (outputs 384)
    for (bool spare : {false, true})
      for (bool with_bias : {false, true}) check_lora_residual(kGpu, n, 256, 384, 16, spare, with_bias);
}

// merged_weight on the GPU against the CPU's: the same bf16 parts, one rounding each.
TEST(LoraCuda, MergedWeightMatchesCpu) {
  const int64_t out = 320, in = 512, r = 16;
  const Tensor w = bf16_values({out, in}, 71, 0.1).to(DType::bf16), a = bf16_values({r, in}, 72, 0.1).to(DType::f32);
  const Tensor b = bf16_values({out, r}, 73, 0.1).to(DType::f32);
  auto merged = [&](Device d) {
    const Tensor b_parts = ops::bf16_split(b.to(d), "hhlh");
    return ag::detail::merged_weight(w.to(d), b_parts.narrow(1, r, 3 * r), ag::detail::split_rows(a.to(d), "hhl"), 2.f)
        .to(Device::cpu());
  };
  EXPECT_LT(rel_err(merged(kGpu), merged(Device::cpu())), 4e-3);
}

}  // namespace
}  // namespace loom::test
