// The gradient Reducers under 1, 2 and 3 ranks against one process that holds every rank's
// gradients: DDP's bucketed all-reduce (through real backward() hooks, with accumulation
// micro-steps and a rank that skips its last backward) equals the sum, and ZeRO-2 (AdamW and 8-bit
// AdamW, f32 and bf16 parameters, shards cutting parameters and 8-bit blocks) leaves the same
// weights as an unsharded optim::Optimizer given the summed gradients, also after re-sharding an
// unsharded optimizer's state. Gradients are multiples of 1/64 so every sum is exact in any order:
// the comparisons are bit for bit, except the clipped run (the norm is summed in another order).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "autograd/functions.h"
#include "autograd/tape.h"
#include "dist/ddp.h"
#include "dist/zero2.h"
#include "optim/adamw.h"
#include "tests/dist/mpi_main.h"

namespace loom::test {
namespace {

const std::vector<Shape> kShapes = {{8, 16}, {33}, {70, 80}, {5}, {300}};  // 5600 elements: 8-bit blocks

// The gradient rank r contributes to parameter p at micro-step m: small multiples of 1/64.
Tensor grad_of(int p, int r, int m, const Shape& s, DType dt) {
  std::vector<float> v(numel_of(s));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(static_cast<int>((i * 7 + p * 13 + r * 5 + m * 3) % 17) - 8) / 64.f;
  return Tensor::from_floats(v, s).to(dt);
}

Tensor init_of(int p, const Shape& s, DType dt) {
  std::vector<float> v(numel_of(s));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i * 3 + p)) * 0.5f;
  return Tensor::from_floats(v, s).to(dt);
}

void backward_with(ag::Variable& v, const Tensor& g) { ag::backward(ag::sum(ag::mul(v, ag::Variable(g)))); }

bool bits_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.nbytes() == y.nbytes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

TEST(DdpReducer, BucketedAllReduceThroughHooksEqualsTheSum) {
  dist::Communicator& c = group().cpu();
  const int w = c.world_size(), me = c.rank();
  std::vector<ag::Variable> params;
  for (size_t p = 0; p < kShapes.size(); ++p) params.emplace_back(init_of(p, kShapes[p], DType::f32), true);
  dist::DdpReducer ddp(c, params, /*bucket_bytes=*/4000);
  EXPECT_GE(ddp.num_buckets(), 3);
  dist::attach_grad_hooks(ddp, params);
  for (int step = 0; step < 2; ++step) {
    for (int m = 0; m < 2; ++m) {
      ddp.set_sync(m == 1);
      if (m == 1 && me == 1 && step == 1) continue;  // rank 1's last micro-batch had nothing to learn
      // One backward over every parameter, so the hooks fire in backward order.
      ag::Variable total;
      for (size_t p = 0; p < params.size(); ++p) {
        ag::Variable term = ag::sum(ag::mul(params[p], ag::Variable(grad_of(p, me, m + step, kShapes[p], DType::f32))));
        total = total.defined() ? ag::add(total, term) : term;
      }
      ag::backward(total);
    }
    ddp.finalize();
    for (size_t p = 0; p < params.size(); ++p) {
      Tensor want = Tensor::zeros(kShapes[p], DType::f32);
      for (int r = 0; r < w; ++r)
        for (int m = 0; m < 2; ++m)
          if (!(m == 1 && r == 1 && step == 1)) want = ops::add(want, grad_of(p, r, m + step, kShapes[p], DType::f32));
      ASSERT_TRUE(params[p].grad().defined());
      EXPECT_TRUE(bits_equal(params[p].grad(), want)) << "step " << step << " param " << p;
      params[p].zero_grad();
    }
  }
}

struct Case {
  const char* rule;
  DType dtype;
};

// Runs `steps` steps of ZeRO-2 on this rank and of an unsharded Optimizer holding every rank's
// gradients; compares the weights after each step.
void compare_with_unsharded(const Case& k, float max_norm, bool reshard_from_unsharded, int64_t bucket_bytes = 3000) {
  dist::Communicator& c = group().cpu();
  const int w = c.world_size(), me = c.rank();
  auto rule = [&] { return *optim::make_update_rule(k.rule, {0.9f, 0.99f, 1e-8f}, Device::cpu()); };
  optim::Optimizer sharded(rule(), /*sharded=*/true), ref(rule());
  std::vector<ag::Variable> mine, theirs;
  for (optim::Optimizer* o : {&sharded, &ref}) {
    o->add_group({"decay", 1.f, 0.1f});
    o->add_group({"plain", 0.5f, 0.f});
  }
  for (size_t p = 0; p < kShapes.size(); ++p) {
    mine.emplace_back(init_of(p, kShapes[p], k.dtype), true);
    theirs.emplace_back(init_of(p, kShapes[p], k.dtype), true);
    sharded.add_param("p" + std::to_string(p), mine.back(), p % 2);
    ref.add_param("p" + std::to_string(p), theirs.back(), p % 2);
  }
  int64_t done = 0;
  auto ref_step = [&](int step) {
    double sq = 0;
    for (size_t p = 0; p < kShapes.size(); ++p) {
      Tensor g = Tensor::zeros(kShapes[p], DType::f32);
      for (int r = 0; r < w; ++r) g = ops::add(g, grad_of(p, r, step, kShapes[p], DType::f32));
      for (float x : g.to_floats()) sq += double(x) * x;
      backward_with(theirs[p], g.to(k.dtype));
    }
    const float coef = max_norm > 0 ? std::min(1.f, max_norm / (static_cast<float>(std::sqrt(sq)) + 1e-6f)) : 1.f;
    ref.step(1e-2f, coef);
    ref.zero_grad();
  };
  if (reshard_from_unsharded) {  // two unsharded steps, then its state re-sharded onto this world
    for (; done < 2; ++done) ref_step(done);
    for (size_t p = 0; p < kShapes.size(); ++p) {
      Tensor v = mine[p].value();
      v.copy_(theirs[p].value());
    }
  }
  dist::Zero2 zero(c, sharded, bucket_bytes);
  if (reshard_from_unsharded) {
    ASSERT_TRUE(zero.load_state_dicts({ref.state_dict(true)}, "reference").ok());
  }
  dist::attach_grad_hooks(zero, mine);
  EXPECT_LE(zero.shard_bytes() * w, zero.unsharded_bytes() + w * (8 * 256 + 2 * 256 * 4 + 4096 * 12));
  for (; done < 4; ++done) {
    for (size_t p = 0; p < kShapes.size(); ++p) backward_with(mine[p], grad_of(p, me, done, kShapes[p], k.dtype));
    zero.finalize();
    const dist::ClipResult cr = zero.step(1e-2f, max_norm);
    ref_step(done);
    for (size_t p = 0; p < kShapes.size(); ++p) {
      if (max_norm > 0) {
        const auto a = mine[p].value().to_floats(), b = theirs[p].value().to_floats();
        // The norm's f32 sum runs in another order: coef differs in its last bits, the update by
        // lr * 1e-6 relative at most.
        for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-6) << "param " << p << " elem " << i;
        EXPECT_LT(cr.coef, 1.f);
      } else {
        EXPECT_TRUE(bits_equal(mine[p].value(), theirs[p].value()))
            << k.rule << " " << name(k.dtype) << " step " << done << " param " << p;
      }
      EXPECT_FALSE(mine[p].grad().defined()) << "the leaf gradient is released once reduce-scattered";
    }
  }
}

TEST(Zero2, AdamWF32EqualsUnsharded) { compare_with_unsharded({"adamw", DType::f32}, 0, false); }
TEST(Zero2, AdamWBf16EqualsUnsharded) { compare_with_unsharded({"adamw", DType::bf16}, 0, false); }
TEST(Zero2, AdamW8bitF32EqualsUnsharded) { compare_with_unsharded({"adamw8bit", DType::f32}, 0, false); }
TEST(Zero2, AdamW8bitBf16EqualsUnsharded) { compare_with_unsharded({"adamw8bit", DType::bf16}, 0, false); }
TEST(Zero2, ClipsByTheGlobalNorm) { compare_with_unsharded({"adamw", DType::f32}, 0.5f, false); }
TEST(Zero2, ReshardsAnUnshardedState) { compare_with_unsharded({"adamw8bit", DType::f32}, 0, true); }
TEST(Zero2, ReshardsAnUnshardedStateAdamW) { compare_with_unsharded({"adamw", DType::bf16}, 0, true); }
// One parameter a bucket: older buckets are settled (waited for, converted, freed) while later
// ones are still being added, as in a long backward.
TEST(Zero2, SettlesBucketsDuringBackward) {
  compare_with_unsharded({"adamw", DType::bf16}, 0, false, /*bucket_bytes=*/1);
  compare_with_unsharded({"adamw8bit", DType::f32}, 0, false, /*bucket_bytes=*/1);
}

// Backward holds a few buckets at a time, not a copy of every gradient: each bucket (and the bf16
// part it receives) is freed once its reduce-scatter is done. Counted by the CPU allocator while
// 40 one-parameter buckets arrive in backward's order.
TEST(Zero2, FreesEachBucketOnceReduced) {
  dist::Communicator& c = group().cpu();
  constexpr int kParams = 40;
  constexpr int64_t kNumel = 1024, kBucketBytes = kNumel * 2;  // bf16: one parameter per bucket
  optim::Optimizer sharded(*optim::make_update_rule("adamw", {0.9f, 0.99f, 1e-8f}, Device::cpu()), /*sharded=*/true);
  sharded.add_group({"all", 1.f, 0.f});
  std::vector<ag::Variable> params;
  for (int p = 0; p < kParams; ++p) {
    params.emplace_back(init_of(p, {kNumel}, DType::bf16), true);
    sharded.add_param("p" + std::to_string(p), params.back(), 0);
  }
  dist::Zero2 zero(c, sharded, kBucketBytes);
  const int64_t before = memory_stats(Device::cpu()).current_bytes;
  int64_t most = 0;
  for (int p = kParams - 1; p >= 0; --p) {  // the last registered parameter's gradient comes first
    Tensor g = grad_of(p, c.rank(), 0, {kNumel}, DType::bf16);
    const int64_t leaf = g.nbytes();
    reset_peak_memory(Device::cpu());
    zero.add(p, g);
    most = std::max(most, memory_stats(Device::cpu()).peak_bytes - before - leaf);
  }
  zero.finalize();
  // Inside add(): the bucket just launched and the kBucketsInFlight before it, each its buffer and
  // its received part (at most as large), padded to the rule's alignment, before the oldest settles.
  const int64_t bucket = bytes_for(DType::bf16, kNumel + sharded.rule().alignment());
  EXPECT_LE(most, int64_t(dist::Zero2::kBucketsInFlight + 1) * 2 * bucket)
      << "holding every bucket and received part would be " << kParams * 2 * bucket << " bytes";
  EXPECT_LE(memory_stats(Device::cpu()).current_bytes - before, 0) << "finalize() frees every bucket";
}

}  // namespace
}  // namespace loom::test
