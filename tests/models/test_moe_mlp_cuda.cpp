// MoeMlp (models/layers.h) on CUDA against the same layer on the CPU, in f32: the output, the
// choices, the load-balancing loss of its router logits (a device scalar) and every gradient of
// sum(y * r) + 0.5 aux (x, router, gate_up, down) through the whole autograd path: router GEMM,
// routing, the device dispatch, the gather, the per-expert GEMMs, the combine and the aux loss.
#include <gtest/gtest.h>

#include <initializer_list>
#include <random>

#include "autograd/tape.h"
#include "models/layers.h"
#include "tests/models/fixtures.h"

namespace loom::test {
namespace {

Tensor random(const Shape& s, uint32_t seed, float scale) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(numel_of(s));
  for (float& x : v) x = d(g);
  return Tensor::from_floats(v, s);
}

struct LayerRun {
  Tensor y, choices, aux;
  std::vector<Tensor> grads;  // x, router, gate_up, down (on the CPU)
};

LayerRun run_layer(Device dev, int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t k,
                   bool renorm) {
  MoeMlp m;
  m.router = ag::Variable(random({experts, hidden}, 2, 1.f).to(dev), true);
  m.gate_up.weight = ag::Variable(random({experts, 2 * inter, hidden}, 3, 0.3f).to(dev), true);
  m.gate_up.experts = experts, m.gate_up.out = 2 * inter, m.gate_up.in = hidden;
  m.down.weight = ag::Variable(random({experts, hidden, inter}, 4, 0.3f).to(dev), true);
  m.down.experts = experts, m.down.out = hidden, m.down.in = inter;
  m.top_k = k, m.renormalize = renorm;
  const ag::Variable x(random({tokens, hidden}, 1, 1.f).to(dev), true);
  const ag::Variable r(random({tokens, hidden}, 5, 1.f).to(dev), false);
  RouterOutput routed;
  LayerRun out;
  const ag::Variable y = m.forward(x, &routed);
  out.choices = routed.ids;
  const ag::Variable aux = ag::moe_aux_loss(routed.logits, out.choices);
  EXPECT_EQ(aux.value().device(), dev);
  out.y = y.value().to(Device::cpu());
  out.aux = aux.value().to(Device::cpu());
  ag::backward(ag::add(ag::sum(ag::mul(y, r)), ag::scale(aux, 0.5f)));
  for (const ag::Variable* v : std::initializer_list<const ag::Variable*>{&x, &m.router, &m.gate_up.weight, &m.down.weight})
    out.grads.push_back(v->grad().to(Device::cpu()));
  return out;
}

TEST(MoeMlpCuda, IsTheCpuLayer) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    int64_t tokens, hidden, inter, experts, k;
    bool renorm;
  };
  // Qwen3-MoE's routing (128 experts, top 8, norm_topk_prob) and Mixtral's (8, top 2, renormalised
  // always), at small widths; the unrenormalised softmax too.
  for (const Case& c : {Case{512, 64, 32, 128, 8, true}, Case{300, 48, 40, 8, 2, true}, Case{64, 32, 16, 16, 4, false}}) {
    const std::string what = "E " + std::to_string(c.experts) + " K " + std::to_string(c.k);
    const LayerRun cpu = run_layer(Device::cpu(), c.tokens, c.hidden, c.inter, c.experts, c.k, c.renorm);
    const LayerRun gpu = run_layer(Device::cuda(0), c.tokens, c.hidden, c.inter, c.experts, c.k, c.renorm);
    // The router's logits come from two different f32 GEMMs; with continuous random weights no
    // token's k-th and (k+1)-th probabilities are within their rounding of each other.
    EXPECT_EQ(gpu.choices.to_ints(), cpu.choices.to_ints()) << what;
    // f32 throughout: GEMMs and reductions in other orders, a dozen ops deep: 1e-5 relative.
    EXPECT_LT(rel_err(gpu.y, cpu.y), 1e-5) << what;
    EXPECT_NEAR(gpu.aux.item(), cpu.aux.item(), 1e-5 * cpu.aux.item()) << what;
    const char* names[] = {"x", "router", "gate_up", "down"};
    for (size_t i = 0; i < cpu.grads.size(); ++i)
      EXPECT_LT(rel_err(gpu.grads[i], cpu.grads[i]), 1e-5) << what << " d" << names[i];
  }
}

}  // namespace
}  // namespace loom::test
