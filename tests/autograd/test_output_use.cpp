// OutputUse::kRootOnly (autograd/functions.h): a function whose output nothing reads records the
// same node and skips the work that makes the value. Every such function's gradients, taken from
// the same upstream gradient, are bit for bit those of the same call with the value computed; the
// unread value has the computed one's shape and dtype. bf16 runs the LoRA function's split path.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "tests/autograd/gradcheck.h"

namespace loom::test {
namespace {

using ag::OutputUse;
using ag::Variable;
using Fn = std::function<Variable(const std::vector<Variable>&, OutputUse)>;

// fn's inputs (all requiring grad unless frozen[i]) under each use, backward from dy: the
// gradients must be equal bit for bit, and the outputs alike in shape and dtype. An output whose work
// was skipped has no memory behind it (detail::unread_value), so a backward that read it would fault;
// one computed anyway (a linear's product read by its bias) is filled with NaN before backward, so a
// backward that read it would show.
void expect_same_gradients(const std::string& what, const Fn& fn, const std::vector<Tensor>& inputs,
                           const std::vector<bool>& frozen, uint32_t seed) {
  std::vector<Tensor> grads[2];
  Shape shapes[2];
  DType dtypes[2] = {DType::f32, DType::f32};
  Tensor dy;
  for (int u = 0; u < 2; ++u) {
    std::vector<Variable> vars;
    for (size_t i = 0; i < inputs.size(); ++i) vars.emplace_back(inputs[i].clone(), !frozen[i]);
    const Variable y = fn(vars, u == 0 ? OutputUse::kRead : OutputUse::kRootOnly);
    if (u == 1 && y.value().data_ptr() != nullptr) {
      Tensor unread = y.value();
      ops::fill_(unread, std::numeric_limits<float>::quiet_NaN());
    }
    shapes[u] = y.value().shape();
    dtypes[u] = y.dtype();
    if (!dy.defined()) dy = bf16_values(y.value().shape(), seed, 1.0).to(y.dtype());
    ag::backward(y, dy);
    for (size_t i = 0; i < vars.size(); ++i) grads[u].push_back(frozen[i] ? Tensor() : vars[i].grad());
  }
  EXPECT_EQ(shapes[0], shapes[1]) << what;
  EXPECT_EQ(dtypes[0], dtypes[1]) << what;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (frozen[i]) continue;
    ASSERT_TRUE(grads[0][i].defined() && grads[1][i].defined()) << what << ": input " << i;
    EXPECT_EQ(grads[0][i].to_doubles(), grads[1][i].to_doubles()) << what << ": gradient of input " << i;
  }
}

TEST(OutputUse, LoraLinearGradientsDoNotDependOnTheValue) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::string what = "lora_linear " + std::string(name(dt));
    const Tensor x = bf16_values({2, 9, 24}, 1, 1.0).to(dt), w = bf16_values({20, 24}, 2, 0.1).to(dt);
    const Tensor a = bf16_values({4, 24}, 3, 0.1).to(DType::f32), b = bf16_values({20, 4}, 4, 0.1).to(DType::f32);
    const ag::LoraArgs args{2.f, 0.f, 0, 0};
    expect_same_gradients(what, [&](const std::vector<Variable>& v, OutputUse use) {
      return ag::lora_linear(v[0], v[1], v[2], v[3], args, nullptr, {}, {}, use);
    }, {x, w, a, b}, {false, true, false, false}, 5);
    // With a bias (the base product first), and with dropout on the adapter's input.
    const Tensor bias = bf16_values({20}, 7, 0.1).to(dt);
    expect_same_gradients(what + " with a bias", [&](const std::vector<Variable>& v, OutputUse use) {
      return ag::lora_linear(v[0], v[1], v[2], v[3], args, &v[4], {}, {}, use);
    }, {x, w, a, b, bias}, {false, true, false, false, false}, 8);
    const ag::LoraArgs dropped{2.f, 0.25f, 3, 5};
    expect_same_gradients(what + " with dropout", [&](const std::vector<Variable>& v, OutputUse use) {
      return ag::lora_linear(v[0], v[1], v[2], v[3], dropped, nullptr, {}, {}, use);
    }, {x, w, a, b}, {false, true, false, false}, 9);
    // QLoRA's way: backward makes the frozen weight again, so the unread run gets a weight of NaN
    // (Linear::forward passes an uninitialised one) and must not use it.
    expect_same_gradients(what + " with the weight made again", [&](const std::vector<Variable>& v, OutputUse use) {
      const Variable shown(use == OutputUse::kRead ? w : ops::scale(w, std::numeric_limits<float>::quiet_NaN()), false);
      return ag::lora_linear(v[0], shown, v[2], v[3], args, nullptr, [w] { return w; }, {}, use);
    }, {x, w, a, b}, {false, true, false, false}, 10);
    // The weight trained too (full fine-tuning with an adapter), and x computed again in backward.
    expect_same_gradients(what + " with dW and x recomputed", [&](const std::vector<Variable>& v, OutputUse use) {
      const Tensor again = v[0].value();
      return ag::lora_linear(v[0], v[1], v[2], v[3], args, nullptr, {}, [again] { return again; }, use);
    }, {x, w, a, b}, {false, false, false, false}, 6);
  }
}

TEST(OutputUse, FrozenLinearMatmulLinearAndAdd) {
  const Tensor x = random_f64({3, 5, 8}, 11), w = random_f64({6, 8}, 12), bias = random_f64({6}, 13);
  const Tensor w_remat = w.clone();
  expect_same_gradients("frozen_linear", [&](const std::vector<Variable>& v, OutputUse use) {
    const Variable shown(use == OutputUse::kRead ? w : ops::scale(w, std::numeric_limits<float>::quiet_NaN()), false);
    return ag::frozen_linear(v[0], shown, [w_remat] { return w_remat; }, nullptr, use);
  }, {x, w}, {false, true}, 14);
  expect_same_gradients("linear", [](const std::vector<Variable>& v, OutputUse use) {
    return ag::linear(v[0], v[1], nullptr, use);
  }, {x, w}, {false, false}, 15);
  expect_same_gradients("linear with a bias", [](const std::vector<Variable>& v, OutputUse use) {
    return ag::linear(v[0], v[1], &v[2], use);
  }, {x, w, bias}, {false, false, false}, 16);
  const Tensor p = random_f64({3, 8, 4}, 17), q = random_f64({3, 5, 4}, 18);
  expect_same_gradients("batched matmul, b transposed", [](const std::vector<Variable>& v, OutputUse use) {
    return ag::matmul(v[0], v[1], false, true, use);
  }, {p, q}, {false, false}, 19);
  expect_same_gradients("batched matmul, a transposed", [](const std::vector<Variable>& v, OutputUse use) {
    return ag::matmul(v[0], v[1], true, false, use);
  }, {q, q}, {false, false}, 20);
  expect_same_gradients("add", [](const std::vector<Variable>& v, OutputUse use) { return ag::add(v[0], v[1], use); },
                        {p, p}, {false, false}, 21);
}

// A skipped product's output is only a shape: no memory (a MoE rerun's down output was the layer's
// largest transient), views of it work, and it is counted.
TEST(OutputUse, AnUnreadOutputHoldsNoMemory) {
  const Variable a(random_f64({3, 5, 8}, 1), true), b(random_f64({6, 8}, 2), true);
  const int64_t before = ag::unread_outputs();
  const Variable y = ag::matmul(a, b, false, true, OutputUse::kRootOnly);
  EXPECT_EQ(ag::unread_outputs(), before + 1);
  EXPECT_EQ(y.value().shape(), (Shape{3, 5, 6}));
  EXPECT_EQ(y.value().dtype(), DType::f64);
  EXPECT_EQ(y.value().data_ptr(), nullptr);
  EXPECT_EQ(y.value().view({15, 6}).shape(), (Shape{15, 6}));
  EXPECT_EQ(y.value().narrow(1, 2, 3).data_ptr(), nullptr);  // views of it too (no offset from null)
  ag::clear_tape();
}

TEST(OutputUse, AnUnreadSumDoesNotBroadcast) {
  const Variable a(random_f64({3, 4}, 1), true), b(random_f64({4}, 2), true);
  EXPECT_THROW(ag::add(a, b, OutputUse::kRootOnly), Error);
}

}  // namespace
}  // namespace loom::test
