// The Optimizer: the same numbers as calling the kernels directly, groups' lr multiplier and
// weight decay, bf16 compute copies of f32 masters, skipped parameters, and state_dict round trips
// that continue bit for bit (AdamW and AdamW8bit), with clear errors for bad state.
#include <gtest/gtest.h>

#include <cstring>

#include "autograd/functions.h"
#include "autograd/tape.h"
#include "kernels/adamw.h"
#include "optim/adamw.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

Tensor random_tensor(const Shape& shape, uint32_t seed, DType dtype = DType::f32) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return Tensor::from_floats(random_vec<float>(n, seed), shape).to(dtype);
}

void set_grad(ag::Variable& v, const Tensor& g) {
  // A leaf's gradient is what backward accumulates; sum(v * g) has gradient g.
  ag::backward(ag::sum(ag::mul(v, ag::Variable(g))));
}

bool bits_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.nbytes() == y.nbytes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

TEST(Optimizer, AdamWEqualsTheKernelWithGroups) {
  optim::Optimizer opt(optim::make_adamw({0.9f, 0.95f, 1e-6f}));
  const int decay = opt.add_group({"decay", 1.f, 0.1f});
  const int scaled = opt.add_group({"scaled", 0.5f, 0.f});
  ag::Variable a(random_tensor({8, 16}, 1), true), b(random_tensor({33}, 2), true);
  opt.add_param("a", a, decay);
  opt.add_param("b", b, scaled);
  std::vector<float> pa = a.value().to_floats(), pb = b.value().to_floats();
  std::vector<float> ma(pa.size()), va(pa.size()), mb(pb.size()), vb(pb.size());
  for (int64_t step = 1; step <= 3; ++step) {
    const Tensor ga = random_tensor({8, 16}, 10 + step), gb = random_tensor({33}, 20 + step);
    set_grad(a, ga);
    set_grad(b, gb);
    opt.step(/*lr=*/1e-2f, /*grad_scale=*/0.75f);
    opt.zero_grad();
    AdamWParams p;
    p.beta1 = 0.9f, p.beta2 = 0.95f, p.eps = 1e-6f, p.step = step, p.grad_scale = 0.75f;
    p.lr = 1e-2f, p.weight_decay = 0.1f;
    const auto ha = ga.to_floats(), hb = gb.to_floats();
    cpu::adamw_step(pa.data(), ha.data(), ma.data(), va.data(), int64_t(pa.size()), p, nullptr);
    p.lr = 0.5f * 1e-2f, p.weight_decay = 0.f;
    cpu::adamw_step(pb.data(), hb.data(), mb.data(), vb.data(), int64_t(pb.size()), p, nullptr);
    EXPECT_EQ(a.value().to_floats(), pa) << step;
    EXPECT_EQ(b.value().to_floats(), pb) << step;
    EXPECT_FALSE(a.grad().defined());
  }
}

// A gradient scale given as a tensor (the clipping coefficient left where it was computed) gives
// the same bits as the same scale given as a float: read in place by AdamW, read to the host first
// by 8-bit AdamW.
TEST(Optimizer, ScaleFromATensorEqualsTheFloat) {
  for (const char* rule : {"adamw", "adamw8bit"}) {
    auto make = [&] { return std::move(*optim::make_update_rule(rule, {0.9f, 0.999f, 1e-8f}, Device::cpu())); };
    optim::Optimizer by_float(make()), by_tensor(make());
    ag::Variable a(random_tensor({64, 80}, 3), true), b(random_tensor({64, 80}, 3), true);
    by_float.add_param("w", a, by_float.add_group({"all", 1.f, 0.1f}));
    by_tensor.add_param("w", b, by_tensor.add_group({"all", 1.f, 0.1f}));
    const Tensor coef = Tensor::from_floats({7.f, 0.6f}, {2});  // [norm, coefficient], as ops::grad_norm_coef
    for (int step = 0; step < 3; ++step) {
      const Tensor g = random_tensor({64, 80}, 40 + step);
      set_grad(a, g);
      set_grad(b, g);
      by_float.step(1e-2f, 0.6f);
      by_tensor.step(1e-2f, coef.narrow(0, 1, 1));
      by_float.zero_grad();
      by_tensor.zero_grad();
      EXPECT_TRUE(bits_equal(a.value(), b.value())) << rule << " step " << step;
    }
    EXPECT_THROW(by_tensor.step(1e-2f, coef), Error) << "two values are not one scale";
  }
}

TEST(Optimizer, Bf16WeightsGetAnF32MasterAndTheRoundedCopy) {
  optim::Optimizer opt(optim::make_adamw({}));
  opt.add_group({"all", 1.f, 0.f});
  ag::Variable w(random_tensor({64}, 3, DType::bf16), true);
  opt.add_param("w", w);
  const Tensor master0 = opt.params()[0].master.clone();
  EXPECT_EQ(master0.dtype(), DType::f32);
  for (int step = 0; step < 3; ++step) {
    set_grad(w, random_tensor({64}, 30 + step, DType::bf16));
    opt.step(1e-4f);  // updates far below bf16's resolution accumulate in the master
    opt.zero_grad();
  }
  const Tensor& master = opt.params()[0].master;
  EXPECT_FALSE(bits_equal(master, master0));
  EXPECT_TRUE(bits_equal(w.value(), master.to(DType::bf16)));
  EXPECT_TRUE(opt.state_dict().contains("master.w"));
}

TEST(Optimizer, ParametersWithoutGradientsAreSkipped) {
  optim::Optimizer opt(optim::make_adamw({}));
  opt.add_group({"all", 1.f, 0.1f});
  ag::Variable a(random_tensor({4}, 1), true), b(random_tensor({4}, 2), true);
  opt.add_param("a", a);
  opt.add_param("b", b);
  const auto b0 = b.value().to_floats();
  set_grad(a, random_tensor({4}, 5));
  opt.step(1e-2f);
  EXPECT_EQ(b.value().to_floats(), b0);
  EXPECT_EQ(opt.params()[0].step, 1);
  EXPECT_EQ(opt.params()[1].step, 0);
}

// A run saved after two steps and restored into fresh weights continues as the uninterrupted run.
void round_trip(const std::string& rule) {
  auto make = [&](ag::Variable& big, ag::Variable& small) {
    auto r = optim::make_update_rule(rule, {}, Device::cpu());
    EXPECT_TRUE(r.ok());
    auto opt = std::make_unique<optim::Optimizer>(*std::move(r));
    opt->add_group({"all", 1.f, 0.01f});
    opt->add_param("big", big);  // >= 4096 elements: 8-bit state under adamw8bit
    opt->add_param("small", small);
    return opt;
  };
  auto train = [&](optim::Optimizer& opt, ag::Variable& big, ag::Variable& small, int from, int to) {
    for (int s = from; s < to; ++s) {
      set_grad(big, random_tensor({80, 64}, 100 + s));
      set_grad(small, random_tensor({100}, 200 + s));
      opt.step(1e-3f);
      opt.zero_grad();
    }
  };
  ag::Variable big(random_tensor({80, 64}, 1), true), small(random_tensor({100}, 2), true);
  auto whole = make(big, small);
  train(*whole, big, small, 0, 5);

  ag::Variable big2(random_tensor({80, 64}, 1), true), small2(random_tensor({100}, 2), true);
  auto first = make(big2, small2);
  train(*first, big2, small2, 0, 2);
  const auto saved = first->state_dict();
  if (rule == "adamw8bit") {
    EXPECT_EQ(saved.at("state1.big").dtype(), DType::u8);
    EXPECT_EQ(saved.at("absmax1.big").numel(), 80 * 64 / 256);
    EXPECT_EQ(saved.at("state1.small").dtype(), DType::f32);
    EXPECT_TRUE(saved.contains("qmap1") && saved.contains("qmap2"));
    // 8-bit state: 2 bytes per element plus 8 per 256, about a quarter of AdamW's 8.
    EXPECT_LT(double(first->state_bytes() - 2 * 100 * 4), 0.26 * 8 * 80 * 64 + 2 * 256 * 4);
  }
  ag::Variable big3(big2.value().clone(), true), small3(small2.value().clone(), true);
  auto resumed = make(big3, small3);
  ASSERT_TRUE(resumed->load_state_dict(saved, "test").ok());
  train(*resumed, big3, small3, 2, 5);
  EXPECT_TRUE(bits_equal(big3.value(), big.value())) << rule;
  EXPECT_TRUE(bits_equal(small3.value(), small.value())) << rule;
  const auto a = resumed->state_dict(), b = whole->state_dict();
  for (const auto& [name, t] : b) EXPECT_TRUE(bits_equal(a.at(name), t)) << rule << " " << name;
}
TEST(Optimizer, AdamWStateRoundTripContinuesExactly) { round_trip("adamw"); }
TEST(Optimizer, AdamW8bitStateRoundTripContinuesExactly) { round_trip("adamw8bit"); }

TEST(Optimizer, BadStateIsAClearError) {
  auto r = optim::make_update_rule("adamw8bit", {}, Device::cpu());
  ASSERT_TRUE(r.ok());
  optim::Optimizer opt(*std::move(r));
  opt.add_group({"all", 1.f, 0.f});
  ag::Variable w(random_tensor({5000}, 1), true);
  opt.add_param("w", w);
  auto sd = opt.state_dict();
  sd.erase("absmax2.w");
  absl::Status s = opt.load_state_dict(sd, "ckpt/optimizer.safetensors");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ckpt/optimizer.safetensors: missing optimizer tensor absmax2.w"), std::string::npos)
      << s.message();
  sd = opt.state_dict();
  sd["state1.w"] = Tensor::zeros({5000}, DType::f32);
  s = opt.load_state_dict(sd, "x");
  EXPECT_NE(s.message().find("state1.w is f32[5000]"), std::string::npos) << s.message();
  EXPECT_FALSE(optim::make_update_rule("sgd", {}, Device::cpu()).ok());
}

// CPU offload (Placement::kHost) against the device optimizer on CPU tensors: the same kernels on the
// same numbers, so weights and state must be equal bit for bit — with a weight large enough to run
// alone (1 << 18 elements and more) among small ones gathered into one stage, bf16 and f32 weights,
// a parameter without gradient, and state_dicts that load into either placement.
void offload_equals_device(const std::string& rule, DType dtype) {
  struct Run {
    std::vector<ag::Variable> vars;
    std::unique_ptr<optim::Optimizer> opt;
  };
  const std::vector<Shape> shapes = {{520, 512}, {64, 8}, {5000}, {8, 64}, {100}, {33}};
  auto make = [&](optim::Placement placement) {
    Run r;
    auto rule_or = optim::make_update_rule(rule, {0.9f, 0.95f, 1e-6f}, Device::cpu());
    EXPECT_TRUE(rule_or.ok());
    r.opt = std::make_unique<optim::Optimizer>(*std::move(rule_or), false, placement);
    const int decay = r.opt->add_group({"decay", 1.f, 0.1f});
    const int other = r.opt->add_group({"other", 0.5f, 0.f});
    for (size_t i = 0; i < shapes.size(); ++i) {
      r.vars.emplace_back(random_tensor(shapes[i], 1 + uint32_t(i), i == 4 ? DType::f32 : dtype), true);
      r.opt->add_param("p" + std::to_string(i), r.vars.back(), i % 2 ? other : decay);
    }
    return r;
  };
  auto train = [&](Run& r, int from, int to) {
    for (int s = from; s < to; ++s) {
      for (size_t i = 0; i + 1 < shapes.size(); ++i)  // the last one gets no gradient
        set_grad(r.vars[i], random_tensor(shapes[i], 100 * s + uint32_t(i), r.vars[i].dtype()));
      r.opt->step(1e-2f, 0.8f);
      r.opt->zero_grad();
    }
  };
  Run device = make(optim::Placement::kDevice), host = make(optim::Placement::kHost);
  EXPECT_TRUE(host.opt->offloaded());
  train(device, 0, 3);
  train(host, 0, 3);
  for (size_t i = 0; i < shapes.size(); ++i)
    EXPECT_TRUE(bits_equal(device.vars[i].value(), host.vars[i].value())) << rule << " p" << i;
  const auto a = device.opt->state_dict(), b = host.opt->state_dict();
  EXPECT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(b.contains(name) && bits_equal(t, b.at(name))) << rule << " " << name;
  EXPECT_EQ(host.opt->state_bytes(), device.opt->state_bytes());
  EXPECT_EQ(host.opt->master_bytes(), device.opt->master_bytes());
  EXPECT_GT(host.opt->staging_bytes(), 0);
  // Either placement's state resumes in the other and both continue alike.
  Run to_host = make(optim::Placement::kHost), to_device = make(optim::Placement::kDevice);
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor h = to_host.vars[i].value(), d = to_device.vars[i].value();
    h.copy_(device.vars[i].value());
    d.copy_(host.vars[i].value());
  }
  ASSERT_TRUE(to_host.opt->load_state_dict(a, "device").ok());
  ASSERT_TRUE(to_device.opt->load_state_dict(b, "host").ok());
  train(device, 3, 5);
  train(to_host, 3, 5);
  train(to_device, 3, 5);
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_TRUE(bits_equal(device.vars[i].value(), to_host.vars[i].value())) << rule << " resumed on host p" << i;
    EXPECT_TRUE(bits_equal(device.vars[i].value(), to_device.vars[i].value())) << rule << " resumed on device p" << i;
  }
}
TEST(Optimizer, OffloadedAdamWEqualsTheDeviceOne) { offload_equals_device("adamw", DType::f32); }
TEST(Optimizer, OffloadedAdamWBf16EqualsTheDeviceOne) { offload_equals_device("adamw", DType::bf16); }
TEST(Optimizer, OffloadedAdamW8bitEqualsTheDeviceOne) { offload_equals_device("adamw8bit", DType::f32); }
TEST(Optimizer, OffloadedAdamW8bitBf16EqualsTheDeviceOne) { offload_equals_device("adamw8bit", DType::bf16); }

}  // namespace
}  // namespace loom::test
