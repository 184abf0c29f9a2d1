// The mixture-of-experts functions (ag::moe_route, grouped_linear, moe_combine; moe_row_weights and
// moe_sum for the weights applied before down) composed into a SwiGLU expert layer as Mixtral and
// Qwen3-MoE run it, against a per-token f64 loop written here
// from transformers' MixtralSparseMoeBlock (softmax in f32/f64, top k, renormalised or not, each
// chosen expert's down(silu(gate x) * up x) weighted and summed), and f64 finite differences of
// every input: the tokens, the router and the three stacked expert weights.
#include <algorithm>
#include <numeric>

#include "tests/autograd/gradcheck.h"

namespace loom::test {
namespace {
using V = std::vector<ag::Variable>;
using ag::Variable;

constexpr int64_t kT = 7, kH = 5, kI = 3, kE = 4;

// x [T, H], router [E, H], gate and up [E, I, H], down [E, H, I] -> y [T, H].
Variable moe_layer(const V& v, int64_t k, bool renorm) {
  const Variable &x = v[0], &router = v[1], &gate = v[2], &up = v[3], &down = v[4];
  ag::MoeRouting r = ag::moe_route(ag::linear(x, router), k, renorm);
  const ops::MoeDispatch d = ops::moe_dispatch(r.route.ids, router.shape()[0]);
  const Variable xs = ag::embedding(d.token_of_row, x);
  const Variable act = ag::swiglu(ag::grouped_linear(xs, gate, d.offsets), ag::grouped_linear(xs, up, d.offsets));
  return ag::moe_combine(ag::grouped_linear(act, down, d.offsets), r.weights, d.row_of);
}

// The same layer as models/layers.cpp runs it: each row's routing weight scales its SwiGLU output
// before down (moe_row_weights, moe_combine over d.rows), and moe_sum adds each token's rows.
Variable moe_layer_weights_first(const V& v, int64_t k, bool renorm) {
  const Variable &x = v[0], &router = v[1], &gate = v[2], &up = v[3], &down = v[4];
  ag::MoeRouting r = ag::moe_route(ag::linear(x, router), k, renorm);
  const ops::MoeDispatch d = ops::moe_dispatch(r.route.ids, router.shape()[0]);
  const Variable xs = ag::moe_gather(x, d, k);
  const Variable act = ag::swiglu(ag::grouped_linear(xs, gate, d.offsets), ag::grouped_linear(xs, up, d.offsets));
  const Variable weighted = ag::moe_combine(act, ag::moe_row_weights(r.weights, d), d.rows);
  return ag::moe_sum(ag::grouped_linear(weighted, down, d.offsets), d, k);
}

// The same, one token at a time.
std::vector<double> reference(const std::vector<Tensor>& in, int64_t k, bool renorm) {
  const auto x = in[0].to_doubles(), router = in[1].to_doubles(), gate = in[2].to_doubles(), up = in[3].to_doubles(),
             down = in[4].to_doubles();
  std::vector<double> y(kT * kH, 0.0);
  for (int64_t t = 0; t < kT; ++t) {
    std::vector<double> p(kE);
    for (int64_t e = 0; e < kE; ++e)
      for (int64_t c = 0; c < kH; ++c) p[e] += x[t * kH + c] * router[e * kH + c];
    const double mx = *std::max_element(p.begin(), p.end());
    double z = 0;
    for (double& q : p) z += q = std::exp(q - mx);
    for (double& q : p) q /= z;
    std::vector<int64_t> order(kE);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[j];
      const double w = renorm ? p[e] / s : p[e];
      std::vector<double> a(kI);
      for (int64_t i = 0; i < kI; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < kH; ++c) {
          g += gate[(e * kI + i) * kH + c] * x[t * kH + c];
          u += up[(e * kI + i) * kH + c] * x[t * kH + c];
        }
        a[i] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t c = 0; c < kH; ++c)
        for (int64_t i = 0; i < kI; ++i) y[t * kH + c] += w * down[(e * kH + c) * kI + i] * a[i];
    }
  }
  return y;
}

std::vector<Tensor> inputs() {
  return {random_f64({kT, kH}, 1), random_f64({kE, kH}, 2, -2, 2), random_f64({kE, kI, kH}, 3),
          random_f64({kE, kI, kH}, 4), random_f64({kE, kH, kI}, 5)};
}

// Both compositions: the routing weights on down's output (as transformers), and before down (as
// models/layers.cpp).
using Layer = Variable (*)(const V&, int64_t, bool);
const std::pair<const char*, Layer> kLayers[] = {{"weights after down", moe_layer},
                                                 {"weights before down", moe_layer_weights_first}};

TEST(MoeLayer, ForwardIsThePerTokenLoop) {
  for (const auto& [what, layer] : kLayers)
    for (bool renorm : {true, false})
      for (int64_t k : {1, 2, 4}) {
        const std::vector<Tensor> in = inputs();
        V v;
        for (const Tensor& t : in) v.emplace_back(t, false);
        const std::vector<double> got = layer(v, k, renorm).value().to_doubles(), want = reference(in, k, renorm);
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_NEAR(got[i], want[i], 1e-12) << what << " k " << k << " renorm " << renorm;
      }
}

TEST(MoeLayer, GradientsMatchFiniteDifferences) {
  for (const auto& [what, layer] : kLayers)
    for (bool renorm : {true, false})
      for (int64_t k : {1, 2, 3}) {
        SCOPED_TRACE(testing::Message() << what << " k " << k << " renorm " << renorm);
        gradcheck([l = layer, renorm, k](const V& v) { return l(v, k, renorm); }, inputs());
      }
}

TEST(MoeSum, UnreadRecordsTheSameGradients) {
  // kRootOnly computes nothing, yet backward gives the gradient of the read sum.
  const std::vector<Tensor> in = inputs();
  const Tensor ids = Tensor::from_ints({0, 2, 1, 2, 3, 0, 1, 1, 2, 0, 3, 3, 0, 1}, {kT, 2});
  const ops::MoeDispatch d = ops::moe_dispatch(ids, kE);
  const Tensor ys = random_f64({kT * 2, kH}, 9), dy = random_f64({kT, kH}, 10);
  std::vector<std::vector<double>> grads;
  for (ag::OutputUse use : {ag::OutputUse::kRead, ag::OutputUse::kRootOnly}) {
    Variable v(ys, true);
    ag::backward(ag::moe_sum(v, d, 2, use), dy);
    grads.push_back(v.grad().to_doubles());
  }
  EXPECT_EQ(grads[0], grads[1]);
}

TEST(MoeLayer, F32IsTheF64Result) {
  const std::vector<Tensor> in = inputs();
  V v;
  for (const Tensor& t : in) v.emplace_back(t.to(DType::f32), false);
  // The router's logits in f32 either way (transformers' softmax dtype); the rest as the weights.
  ag::MoeRouting r = ag::moe_route(ag::linear(v[0], v[1]), 2, true);
  EXPECT_EQ(r.weights.dtype(), DType::f32);
  const std::vector<double> got = moe_layer(v, 2, true).value().to_doubles(), want = reference(in, 2, true);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5);
}

// load_balancing_loss_func as transformers writes it: one-hot masks of the choices [N, K, E], their
// mean over tokens [K, E], times the mean routing probability [E], summed, times E.
double transformers_aux_loss(const std::vector<double>& logits, const std::vector<int32_t>& ids, int64_t n, int64_t e,
                             int64_t k) {
  std::vector<double> tokens_per_expert(k * e, 0.0), prob(e, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) tokens_per_expert[j * e + ids[t * k + j]] += 1.0 / static_cast<double>(n);
    double z = 0, mx = -1e300;
    for (int64_t x = 0; x < e; ++x) mx = std::max(mx, logits[t * e + x]);
    for (int64_t x = 0; x < e; ++x) z += std::exp(logits[t * e + x] - mx);
    for (int64_t x = 0; x < e; ++x) prob[x] += std::exp(logits[t * e + x] - mx) / z / static_cast<double>(n);
  }
  double overall = 0;
  for (int64_t j = 0; j < k; ++j)
    for (int64_t x = 0; x < e; ++x) overall += tokens_per_expert[j * e + x] * prob[x];
  return overall * static_cast<double>(e);
}

TEST(MoeAuxLoss, IsTransformersLoadBalancingLossAndItsGradient) {
  const Tensor logits = random_f64({9, kE}, 7, -2, 2);
  const Tensor ids = ops::moe_route(logits, 2, true).ids;
  ag::NoGradGuard ng;
  const Tensor loss = ag::moe_aux_loss(Variable(logits, false), ids).value();
  EXPECT_EQ(loss.dtype(), DType::f64);
  EXPECT_EQ(loss.numel(), 1);
  const double got = loss.to_doubles()[0];
  EXPECT_NEAR(got, transformers_aux_loss(logits.to_doubles(), ids.to_ints(), 9, kE, 2), 1e-14);
  EXPECT_NEAR(ops::moe_aux_loss(logits.to(DType::f32), ids).item(), got, 1e-6);
}

TEST(MoeAuxLoss, GradientMatchesFiniteDifferences) {
  const Tensor logits = random_f64({9, kE}, 8, -2, 2);
  const Tensor ids = ops::moe_route(logits, 2, false).ids;  // the choices are constants of the loss
  gradcheck([ids](const V& v) { return ag::moe_aux_loss(v[0], ids); }, {logits});
}

// Rows grouped by expert, each expert's rows in token order; every assignment has its row.
TEST(MoeDispatch, GroupsAssignmentsByExpertStably) {
  const Tensor ids = Tensor::from_ints({2, 0, 1, 2, 2, 3, 0, 1}, {4, 2});
  const ops::MoeDispatch d = ops::moe_dispatch(ids, 5);
  EXPECT_EQ(d.offsets, (std::vector<int64_t>{0, 2, 4, 7, 8, 8}));
  ASSERT_EQ(d.device_offsets.dtype(), DType::i64);
  const int64_t* dev = d.device_offsets.data<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(dev, dev + 6), d.offsets);
  EXPECT_EQ(d.token_of_row.to_ints(), (std::vector<int32_t>{0, 3, 1, 3, 0, 1, 2, 2}));
  const std::vector<int32_t> ids_v = ids.to_ints(), row_of = d.row_of.to_ints(), tok = d.token_of_row.to_ints();
  for (int64_t a = 0; a < 8; ++a) {
    EXPECT_EQ(tok[row_of[a]], a / 2) << a;
    EXPECT_GE(row_of[a], d.offsets[ids_v[a]]) << a;
    EXPECT_LT(row_of[a], d.offsets[ids_v[a] + 1]) << a;
  }
  EXPECT_THROW(ops::moe_dispatch(ids, 3), Error);  // expert 3 of 3
}

}  // namespace
}  // namespace loom::test
