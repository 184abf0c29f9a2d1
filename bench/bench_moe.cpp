// Benchmarks of the mixture-of-experts kernels at Qwen3-30B-A3B's sizes (128 experts, top 8,
// hidden 2048) over 16384 tokens: routing, the load-balancing loss, the dispatch (device part only:
// the offsets' read-back is the caller's) and the weighted combine, forward and backward. All
// memory-bound: bytes count each input read once and each output written once.
#include <string>

#include "bench/bench_util.h"
#include "kernels/moe.h"

namespace loom::bench {
namespace {

constexpr int64_t kTokens = 16384, kExperts = 128, kTopK = 8, kHidden = 2048;
constexpr int64_t kChoices = kTokens * kTopK;

// Routed choices of random logits: ids [T, K] and weights [T, K], as the layer makes them.
struct Routed {
  DeviceArray<float> logits = random_array<float>(kTokens * kExperts, -4.f, 4.f);
  DeviceArray<int32_t> ids{kChoices};
  DeviceArray<float> weights{kChoices};
  Routed() {
    cuda::moe_route_forward(logits.get(), ids.get(), weights.get(), kTokens, kExperts, kTopK, true, ctx().stream);
  }
};

// The dispatch of those choices: row_of [T K] (and token_of_row, offsets).
struct Dispatched : Routed {
  DeviceArray<int32_t> token_of_row{kChoices}, row_of{kChoices};
  DeviceArray<int64_t> offsets{kExperts + 1};
  DeviceArray<uint8_t> ws{cuda::moe_dispatch_workspace_bytes(kChoices, kExperts)};
  void run() {
    cuda::moe_dispatch(ids.get(), kChoices, kTopK, kExperts, token_of_row.get(), row_of.get(), offsets.get(), ws.get(),
                       ctx().stream);
  }
  Dispatched() { run(); }
};

const std::string kShape = "/" + std::to_string(kTokens) + "x" + std::to_string(kExperts) + "/k" + std::to_string(kTopK);

void register_route() {
  const double logits = 4.0 * kTokens * kExperts, choices = 8.0 * kChoices;
  for (bool renorm : {true, false}) {
    const std::string tag = renorm ? "/renorm" : "";
    add("moe_route_fwd/f32" + kShape + tag, [=](benchmark::State& st) {
      Routed r;
      run_timed(st, {logits + choices}, [&] {
        cuda::moe_route_forward(r.logits.get(), r.ids.get(), r.weights.get(), kTokens, kExperts, kTopK, renorm,
                                ctx().stream);
      });
    });
    // Without renorm the backward reads the logits again (the softmax over every expert).
    add("moe_route_bwd/f32" + kShape + tag, [=](benchmark::State& st) {
      Routed r;
      auto dw = random_array<float>(kChoices);
      DeviceArray<float> dl(kTokens * kExperts);
      run_timed(st, {(renorm ? 0 : logits) + choices + 4.0 * kChoices + logits}, [&] {
        cuda::moe_route_backward(r.logits.get(), r.ids.get(), r.weights.get(), dw.get(), dl.get(), kTokens, kExperts,
                                 kTopK, renorm, ctx().stream);
      });
    });
  }
}

void register_aux_loss() {
  const double logits = 4.0 * kTokens * kExperts, ids = 4.0 * kChoices;
  add("moe_aux_loss_fwd/f32" + kShape, [=](benchmark::State& st) {
    Routed r;
    DeviceArray<uint8_t> ws(cuda::moe_aux_loss_workspace_bytes(kTokens, kExperts));
    DeviceArray<float> loss(1);
    run_timed(st, {logits + ids}, [&] {
      cuda::moe_aux_loss(r.logits.get(), r.ids.get(), kTokens, kExperts, kTopK, loss.get(), ws.get(), ctx().stream);
    });
  });
  add("moe_aux_loss_bwd/f32" + kShape, [=](benchmark::State& st) {
    Routed r;
    DeviceArray<uint8_t> ws(cuda::moe_aux_loss_workspace_bytes(kTokens, kExperts));
    auto dloss = random_array<float>(1);
    DeviceArray<float> dl(kTokens * kExperts);
    run_timed(st, {2 * logits + ids}, [&] {
      cuda::moe_aux_loss_backward(r.logits.get(), r.ids.get(), kTokens, kExperts, kTopK, dloss.get(), dl.get(),
                                  ws.get(), ctx().stream);
    });
  });
}

void register_dispatch() {
  // ids read, row_of and token_of_row written.
  add("moe_dispatch" + kShape, [=](benchmark::State& st) {
    Dispatched d;
    run_timed(st, {12.0 * kChoices}, [&] { d.run(); });
  });
}

void register_combine() {
  const std::string shape = "/bf16/" + std::to_string(kTokens) + "x" + std::to_string(kHidden) + "/k" +
                            std::to_string(kTopK);
  const double rows = 2.0 * kChoices * kHidden, tokens = 2.0 * kTokens * kHidden, small = 8.0 * kChoices;
  add("moe_combine_fwd" + shape, [=](benchmark::State& st) {
    Dispatched d;
    auto ys = random_array<bf16>(kChoices * kHidden);
    DeviceArray<bf16> y(kTokens * kHidden);
    run_timed(st, {rows + tokens + small}, [&] {
      cuda::moe_combine_forward<bf16>(ys.get(), d.row_of.get(), d.weights.get(), y.get(), kTokens, kTopK, kHidden,
                                      ctx().stream);
    });
  });
  add("moe_combine_bwd" + shape, [=](benchmark::State& st) {
    Dispatched d;
    auto ys = random_array<bf16>(kChoices * kHidden), dy = random_array<bf16>(kTokens * kHidden);
    DeviceArray<bf16> dys(kChoices * kHidden);
    DeviceArray<float> dw(kChoices);
    run_timed(st, {2 * rows + tokens + small + 4.0 * kChoices}, [&] {
      cuda::moe_combine_backward<bf16>(ys.get(), d.row_of.get(), d.weights.get(), dy.get(), dys.get(), dw.get(),
                                       kTokens, kTopK, kHidden, ctx().stream);
    });
  });
}

}  // namespace

void register_moe() {
  register_route();
  register_aux_loss();
  register_dispatch();
  register_combine();
}

}  // namespace loom::bench
