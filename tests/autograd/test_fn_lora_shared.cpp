// lora_linear_shared (autograd/fn_lora_shared.cpp): projections of one x with their adapters'
// passes over x and dx shared. Against lora_linear one projection at a time on the same values:
// in f64 (the same arithmetic up to summation order: 1e-12), and in bf16 against that f64 reference
// (bf16's own rounding, as test_fn_lora_bf16.cpp bounds it); finite differences in f64 through the
// shared function itself; x's gradient from another consumer added into (grad_so_far); an output no
// one reads; and the cases it refuses.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "tests/autograd/gradcheck.h"

namespace loom::test {
namespace {

using ag::Variable;

struct Dims {
  int64_t n = 37, in = 48, r = 4;
  std::vector<int64_t> outs = {40, 16, 24};  // q, k, v-like: different widths
  float scale = 2.f;
};

struct Values {
  Tensor x;
  std::vector<Tensor> w, a, b, dy;
  Tensor dr;  // the gradient of the other consumer of x (x * dr summed)
};

Values values_of(const Dims& s) {
  Values v;
  v.x = bf16_values({s.n, s.in}, 1, 1.0);
  v.dr = bf16_values({s.n, s.in}, 2, 1.0);
  for (size_t i = 0; i < s.outs.size(); ++i) {
    const uint32_t k = 10 * uint32_t(i + 1);
    v.w.push_back(bf16_values({s.outs[i], s.in}, k + 1, 0.1));
    v.a.push_back(bf16_values({s.r, s.in}, k + 2, 0.1));
    v.b.push_back(bf16_values({s.outs[i], s.r}, k + 3, 0.1));
    v.dy.push_back(bf16_values({s.n, s.outs[i]}, k + 4, 1.0));
  }
  return v;
}

struct Got {
  std::vector<Tensor> y, da, db;
  Tensor dx;
};

// Runs the projections in dtype dt, shared or one lora_linear each, then backward from
// sum_i <y_i, dy_i> + <x, dr> (x's other consumer last on the tape, so that its gradient is there
// before the projections' backward: grad_so_far's case). `unread`: an output left out of the loss.
Got run(const Dims& s, const Values& v, DType dt, bool shared, int unread = -1) {
  const bool f64 = dt == DType::f64;
  // x made by an op (not a leaf: a leaf's gradient is never handed to a node to add into).
  Variable x0(v.x.to(dt), true);
  Variable x = ag::mul(x0, Variable(Tensor::full(v.x.shape(), 1.f, dt), false));
  std::vector<Variable> w, a, b;
  for (size_t i = 0; i < s.outs.size(); ++i) {
    w.emplace_back(v.w[i].to(dt), false);
    a.emplace_back(f64 ? v.a[i] : v.a[i].to(DType::f32), true);  // f32 masters, as the trainer keeps them
    b.emplace_back(f64 ? v.b[i] : v.b[i].to(DType::f32), true);
  }
  std::vector<Variable> ys;
  if (shared) {
    std::vector<ag::LoraMember> members;
    for (size_t i = 0; i < s.outs.size(); ++i) members.push_back({&w[i], &a[i], &b[i], {}});
    EXPECT_EQ(ag::lora_shared_unsupported(x, members, 0.f), nullptr);
    ys = ag::lora_linear_shared(x, members, s.scale);
  } else {
    for (size_t i = 0; i < s.outs.size(); ++i) ys.push_back(ag::lora_linear(x, w[i], a[i], b[i], {s.scale, 0.f, 0, 0}));
  }
  // Recorded after the projections, so its backward runs first and x's gradient is there before theirs.
  Variable other = ag::mul(x, Variable(v.dr.to(dt), false));
  std::vector<Variable> roots{other};
  std::vector<Tensor> grads{Tensor::full(other.shape(), 1.f, dt)};
  Got got;
  for (size_t i = 0; i < ys.size(); ++i) {
    got.y.push_back(ys[i].value());
    if (int(i) == unread) continue;
    roots.push_back(ys[i]);
    grads.push_back(v.dy[i].to(dt));
  }
  ag::backward(roots, grads);
  got.dx = x0.grad();
  for (size_t i = 0; i < s.outs.size(); ++i) {
    got.da.push_back(a[i].grad());
    got.db.push_back(b[i].grad());
  }
  return got;
}

void expect_close(const Got& got, const Got& want, double tol, const std::string& what) {
  for (size_t i = 0; i < want.y.size(); ++i) {
    EXPECT_LT(rel_err(got.y[i], want.y[i]), tol) << what << " y" << i;
    if (want.da[i].defined()) {
      ASSERT_TRUE(got.da[i].defined()) << what << " dA" << i;
      EXPECT_LT(rel_err(got.da[i], want.da[i]), tol) << what << " dA" << i;
      EXPECT_LT(rel_err(got.db[i], want.db[i]), tol) << what << " dB" << i;
    }
  }
  EXPECT_LT(rel_err(got.dx, want.dx), tol) << what << " dx";
}

TEST(LoraShared, F64MatchesOneProjectionAtATime) {
  for (const Dims& s : {Dims{}, Dims{64, 32, 16, {96, 32}, 0.5f}}) {
    const Values v = values_of(s);
    expect_close(run(s, v, DType::f64, true), run(s, v, DType::f64, false), 1e-12, "f64");
    expect_close(run(s, v, DType::f32, true), run(s, v, DType::f64, false), 1e-5, "f32");
  }
}

// bf16 (the hi + lo split path): within bf16's rounding of the f64 reference, and each adapter's
// share of y on its own (a lost or doubled adapter product cannot hide under the base's rounding).
TEST(LoraShared, Bf16MatchesF64OnTheSameValues) {
  const Dims s;
  const Values v = values_of(s);
  const Got ref = run(s, v, DType::f64, false), got = run(s, v, DType::bf16, true);
  EXPECT_EQ(got.y[0].dtype(), DType::bf16);
  EXPECT_EQ(got.da[0].dtype(), DType::f32);
  expect_close(got, ref, 1e-2, "bf16");
  for (size_t i = 0; i < s.outs.size(); ++i) {
    const Tensor base = ops::matmul(v.x, v.w[i], false, true);
    EXPECT_LT(rel_err(ops::sub(got.y[i].to(DType::f64), base), ops::sub(ref.y[i], base)), 3e-2) << "adapter " << i;
  }
  // And against the one-at-a-time bf16 path: the same figures but for where each rounds.
  expect_close(got, run(s, v, DType::bf16, false), 1e-2, "bf16 one at a time");
}

// An output nothing reads: its adapter gets zero gradients, the others theirs.
TEST(LoraShared, AnUnreadOutput) {
  const Dims s;
  const Values v = values_of(s);
  for (DType dt : {DType::f64, DType::bf16}) {
    const Got got = run(s, v, dt, true, 1), want = run(s, v, DType::f64, false, 1);
    expect_close(got, want, dt == DType::f64 ? 1e-12 : 1e-2, "unread");
  }
}

TEST(LoraShared, FiniteDifferences) {
  const int64_t n = 5, in = 6, r = 2;
  std::vector<Tensor> inputs{random_f64({n, in}, 1)};
  std::vector<bool> wrt{true};
  for (int64_t out : {4, 3}) {
    inputs.push_back(random_f64({out, in}, uint32_t(10 + out)));
    inputs.push_back(random_f64({r, in}, uint32_t(20 + out)));
    inputs.push_back(random_f64({out, r}, uint32_t(30 + out)));
    wrt.insert(wrt.end(), {false, true, true});
  }
  gradcheck(
      [](const std::vector<Variable>& v) {
        const std::vector<ag::LoraMember> m{{&v[1], &v[2], &v[3], {}}, {&v[4], &v[5], &v[6], {}}};
        return ag::cat_last(ag::lora_linear_shared(v[0], m, 1.5f));
      },
      inputs, wrt);
}

TEST(LoraShared, SaysWhatItCannotTake) {
  const Variable x(random_f64({3, 4}, 1), true), w(random_f64({5, 4}, 2), false), a(random_f64({2, 4}, 3), true);
  const Variable b(random_f64({5, 2}, 4), true), a3(random_f64({3, 4}, 5), true), b3(random_f64({5, 3}, 6), true);
  const Variable trained(random_f64({5, 4}, 7), true);
  EXPECT_NE(ag::lora_shared_unsupported(x, {{&w, &a, &b, {}}}, 0.f), nullptr);
  EXPECT_NE(ag::lora_shared_unsupported(x, {{&w, &a, &b, {}}, {&w, &a3, &b3, {}}}, 0.f), nullptr);
  EXPECT_NE(ag::lora_shared_unsupported(x, {{&w, &a, &b, {}}, {&trained, &a, &b, {}}}, 0.f), nullptr);
  EXPECT_NE(ag::lora_shared_unsupported(x, {{&w, &a, &b, {}}, {&w, &a, &b, {}}}, 0.1f), nullptr);
  EXPECT_EQ(ag::lora_shared_unsupported(x, {{&w, &a, &b, {}}, {&w, &a, &b, {}}}, 0.f), nullptr);
  EXPECT_THROW(ag::lora_linear_shared(x, {{&w, &a, &b, {}}, {&w, &a3, &b3, {}}}, 1.f), Error);
}

}  // namespace
}  // namespace loom::test
