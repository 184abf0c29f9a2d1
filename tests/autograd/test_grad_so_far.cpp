// Node::take_grad_so_far: linear layers that share one input (q/k/v, gate/up) add their dx into the
// gradient the others accumulated, in place through the GEMM's beta = 1, instead of a separate add.
// Checked against the sum written out by hand in f64 (f64 and bf16 paths, adapter or not), and that
// a gradient one node handed to two inputs (shared storage) or one in memory Loom does not own
// (borrowed) is never written in place.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "autograd/lambda_node.h"
#include "autograd/tape.h"
#include "engine/memory.h"
#include "tests/autograd/gradcheck.h"

namespace loom::test {
namespace {

using ag::Variable;

// u = 1.5 x feeds a frozen linear, a LoRA linear and another frozen linear (recorded in that order,
// so backward runs them last to first: the second and third add into the first's dx). With one
// upstream gradient g for all three: dx = 1.5 g (W1 + W2 + s B A + W3).
void check_shared_input(DType dt, double tol) {
  const int64_t n = 24, in = 32, out = 40, r = 4;
  const Tensor x = bf16_values({n, in}, 1, 1.0), g = bf16_values({n, out}, 2, 1.0);
  const Tensor w1 = bf16_values({out, in}, 3, 0.1), w2 = bf16_values({out, in}, 4, 0.1),
               w3 = bf16_values({out, in}, 5, 0.1);
  const Tensor a = bf16_values({r, in}, 6, 0.1), b = bf16_values({out, r}, 7, 0.1);
  const ag::LoraArgs args{2.f, 0.f, 0, 0};
  Variable xv(x.to(dt), true);
  Variable av(dt == DType::f64 ? a : a.to(DType::f32), true), bv(dt == DType::f64 ? b : b.to(DType::f32), true);
  const Variable u = ag::scale(xv, 1.5f);
  const Variable y1 = ag::frozen_linear(u, Variable(w1.to(dt)), {});
  const Variable y2 = ag::lora_linear(u, Variable(w2.to(dt)), av, bv, args);
  const Variable y3 = ag::frozen_linear(u, Variable(w3.to(dt)), {});
  ag::backward(std::vector<Variable>{y1, y2, y3}, std::vector<Tensor>{g.to(dt), g.to(dt), g.to(dt)});
  const Tensor wsum = ops::add(ops::add(ops::add(w1, w2), ops::scale(ops::matmul(b, a), 2.f)), w3);
  const Tensor want = ops::scale(ops::matmul(g, wsum), 1.5f);
  EXPECT_EQ(xv.grad().dtype(), dt);
  EXPECT_LT(rel_err(xv.grad(), want), tol) << name(dt);
  EXPECT_TRUE(av.grad().defined() && bv.grad().defined());
}

TEST(GradSoFar, LinearsSharingAnInputSumTheirInputGradients) {
  check_shared_input(DType::f64, 1e-12);
  // bf16: dx rounded to bf16 (2^-9) where it accumulates, and the adapter's ~16-bit operands.
  check_shared_input(DType::bf16, 1e-2);
}

// p = u + v hands one gradient tensor to both u and v. The linear on u runs its backward after the
// add's: u's gradient so far is shared with v's and must not be written in place.
TEST(GradSoFar, AGradientSharedWithAnotherInputStaysPut) {
  const Tensor x = random_f64({6, 8}, 1), w = random_f64({5, 8}, 2);
  const Tensor g1 = random_f64({6, 5}, 3), g2 = random_f64({6, 8}, 4);
  Variable xv(x, true);
  const Variable u = ag::scale(xv, 1.f), v = ag::scale(xv, 2.f);
  const Variable z = ag::frozen_linear(u, Variable(w), {});
  const Variable p = ag::add(u, v);
  ag::backward(std::vector<Variable>{z, p}, std::vector<Tensor>{g1, g2});
  // du = g2 + g1 W, dv = g2: dx = du + 2 dv.
  const Tensor want = ops::add(ops::add(g2, ops::matmul(g1, w)), ops::scale(g2, 2.f));
  EXPECT_LT(rel_err(xv.grad(), want), 1e-12);
  // The caller's upstream gradients are theirs: untouched.
  EXPECT_EQ(g2.to_doubles(), random_f64({6, 8}, 4).to_doubles());
}

// A node hands its input a gradient in borrowed memory (a caller's buffer; here a vector) and
// dies: the gradient's storage has one owner left, yet the linear on the same input must not add
// its dx into it.
TEST(GradSoFar, ABorrowedGradientStaysPut) {
  const Tensor x = random_f64({6, 8}, 1), w = random_f64({5, 8}, 2), g1 = random_f64({6, 5}, 3);
  std::vector<double> buffer = random_f64({6, 8}, 4).to_doubles();
  const std::vector<double> before = buffer;
  Variable xv(x, true);
  const Variable u = ag::scale(xv, 1.f);
  const Variable z = ag::frozen_linear(u, Variable(w), {});
  Tensor borrowed = Tensor::from_storage(
      borrow(buffer.data(), buffer.size() * sizeof(double), Device::cpu(), nullptr), {6, 8}, DType::f64);
  // c = sum(u) in value; its backward hands `borrowed` (moved out: the node keeps no reference).
  const Variable c = ag::record1(
      ag::detail::node_of("hand_borrowed", [borrowed](ag::Node&, const std::vector<Tensor>&) mutable {
        return std::vector<Tensor>{std::move(borrowed)};
      }),
      {&u}, ops::sum(u.value()));
  borrowed = Tensor();
  ag::backward(std::vector<Variable>{z, c}, std::vector<Tensor>{g1, Tensor::full({}, 1.f, c.dtype())});
  const Tensor want = ops::add(ops::matmul(g1, w), Tensor::from_doubles(before, {6, 8}));
  EXPECT_LT(rel_err(xv.grad(), want), 1e-12);
  EXPECT_EQ(buffer, before) << "the borrowed buffer was written";
}

}  // namespace
}  // namespace loom::test
