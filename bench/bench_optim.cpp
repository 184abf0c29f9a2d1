// Benchmarks of the AdamW step on 64Mi f32 master weights (f32 gradients; bf16 gradients with a
// bf16 copy of the result) and of the Philox uniform / normal fills. Memory-bound.
#include <string>

#include "bench/bench_util.h"
#include "kernels/adamw.h"
#include "kernels/philox.h"

namespace loom::bench {
namespace {

constexpr int64_t kParams = int64_t(64) << 20;
constexpr int64_t kFill = int64_t(256) << 20;

template <class G>
void add_adamw(const std::string& name, bool bf16_copy) {
  add(name, [=](benchmark::State& st) {
    auto param = random_array<float>(kParams), exp_avg = random_array<float>(kParams, -1e-3f, 1e-3f);
    auto exp_avg_sq = random_array<float>(kParams, 0.f, 1e-6f);
    auto grad = random_array<G>(kParams, -1e-2f, 1e-2f);
    DeviceArray<bf16> copy(bf16_copy ? kParams : 0);
    AdamWParams p;
    p.lr = 1e-4f;
    p.step = 10;
    // param, exp_avg, exp_avg_sq read and written; grad read; the bf16 copy written.
    const double bytes = double(kParams) * (3 * 8 + sizeof(G) + (bf16_copy ? 2 : 0));
    run_timed(st, {bytes}, [&] {
      cuda::adamw_step<G>(param.get(), grad.get(), exp_avg.get(), exp_avg_sq.get(), kParams, p,
                          bf16_copy ? copy.get() : nullptr, ctx().stream);
    });
  });
}

template <class T>
void add_fills(const char* dtype) {
  const std::string shape = std::string("/") + dtype + "/" + size_name(kFill);
  add("uniform_fill" + shape, [](benchmark::State& st) {
    DeviceArray<T> out(kFill);
    run_timed(st, {double(sizeof(T)) * kFill},
              [&] { cuda::uniform_fill<T>(out.get(), kFill, 1234, 0, -1.f, 1.f, ctx().stream); });
  });
  add("normal_fill" + shape, [](benchmark::State& st) {
    DeviceArray<T> out(kFill);
    run_timed(st, {double(sizeof(T)) * kFill},
              [&] { cuda::normal_fill<T>(out.get(), kFill, 1234, 0, 0.f, 1.f, ctx().stream); });
  });
}

}  // namespace

void register_optim() {
  add_adamw<float>("adamw/f32grad/" + size_name(kParams), false);
  add_adamw<bf16>("adamw/bf16grad_bf16copy/" + size_name(kParams), true);
  add_fills<float>("f32");
  add_fills<bf16>("bf16");
}

}  // namespace loom::bench
