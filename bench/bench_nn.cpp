// Benchmarks of the per-token layers at Llama-7B/8B sizes, forward and backward: RMSNorm, RoPE,
// SwiGLU / GeGLU and the token embedding. All bf16 activations; memory-bound.
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/activation.h"
#include "kernels/embedding.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace loom::bench {
namespace {

constexpr int64_t kTokens = 16384;  // e.g. 8 sequences of 2048
constexpr int64_t kHidden = 4096;
constexpr int64_t kHeads = 32, kHeadDim = 128, kSeq = 2048;
constexpr int64_t kMlpTokens = 8192, kIntermediate = 11008;
constexpr int64_t kVocab = 128256;  // Llama 3
constexpr float kEps = 1e-5f;

std::string x2(int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); }

void register_rms_norm() {
  const int64_t rows = kTokens, cols = kHidden, n = rows * cols;
  const std::string shape = "/bf16/" + x2(rows, cols);
  add("rms_norm_fwd" + shape, [=](benchmark::State& st) {
    auto x = random_array<bf16>(n), w = random_array<bf16>(cols);
    DeviceArray<bf16> y(n);
    DeviceArray<float> rstd(rows);
    run_timed(st, {4.0 * n + 2.0 * cols + 4.0 * rows}, [&] {
      cuda::rms_norm_forward<bf16>(x.get(), w.get(), y.get(), rstd.get(), rows, cols, kEps, false, ctx().stream);
    });
  });
  // With the weight gradient (dw += ...), as for a trainable norm.
  add("rms_norm_bwd" + shape, [=](benchmark::State& st) {
    auto x = random_array<bf16>(n), w = random_array<bf16>(cols), dy = random_array<bf16>(n);
    DeviceArray<bf16> y(n), dx(n);
    DeviceArray<float> rstd(rows);
    auto dw = random_array<float>(cols);
    DeviceArray<uint8_t> ws(cuda::rms_norm_backward_workspace_bytes(rows, cols));
    cuda::rms_norm_forward<bf16>(x.get(), w.get(), y.get(), rstd.get(), rows, cols, kEps, false, ctx().stream);
    run_timed(st, {6.0 * n + 2.0 * cols + 4.0 * rows + 8.0 * cols}, [&] {
      cuda::rms_norm_backward<bf16>(x.get(), w.get(), rstd.get(), dy.get(), dx.get(), dw.get(), rows, cols, false,
                                    ws.get(), ctx().stream);
    });
  });
}

void register_rope() {
  const int64_t n = kTokens * kHeads * kHeadDim;
  const std::string shape = "/bf16/" + std::to_string(kTokens) + "x" + x2(kHeads, kHeadDim);
  // Packed rows of sequences of kSeq tokens; Llama 3 base frequency.
  auto setup = [] {
    std::vector<int32_t> pos(kTokens);
    for (int64_t i = 0; i < kTokens; ++i) pos[i] = static_cast<int32_t>(i % kSeq);
    return std::make_pair(upload_ints(pos), upload_floats(cpu::rope_inv_freq(kHeadDim, 500000.0)));
  };
  const double bytes = 4.0 * n + 4.0 * kTokens + 2.0 * kHeadDim;
  add("rope_fwd" + shape, [=](benchmark::State& st) {
    auto [pos, inv_freq] = setup();
    auto x = random_array<bf16>(n);
    DeviceArray<bf16> y(n);
    run_timed(st, {bytes}, [&] {
      cuda::rope_forward<bf16>(x.get(), y.get(), pos.get(), inv_freq.get(), kTokens, kHeads, kHeadDim, kHeadDim, 1.f,
                               ctx().stream);
    });
  });
  // Llama 3.2 1B's q and k together (32 + 8 heads of 64), as its attention calls it.
  add("rope_pair_fwd/bf16/" + std::to_string(kTokens) + "x" + x2(32 + 8, 64), [=](benchmark::State& st) {
    auto pos = std::move(setup().first);
    auto inv64 = upload_floats(cpu::rope_inv_freq(64, 500000.0));
    const int64_t nq = kTokens * 32 * 64, nk = kTokens * 8 * 64;
    auto q = random_array<bf16>(nq), k = random_array<bf16>(nk);
    DeviceArray<bf16> qo(nq), ko(nk);
    run_timed(st, {4.0 * (nq + nk) + 4.0 * kTokens + 2.0 * 64}, [&] {
      cuda::rope_pair<bf16>(q.get(), qo.get(), 32, k.get(), ko.get(), 8, pos.get(), inv64.get(), kTokens, 64, 64, 1.f,
                            false, ctx().stream);
    });
  });
  add("rope_bwd" + shape, [=](benchmark::State& st) {
    auto [pos, inv_freq] = setup();
    auto dy = random_array<bf16>(n);
    DeviceArray<bf16> dx(n);
    run_timed(st, {bytes}, [&] {
      cuda::rope_backward<bf16>(dy.get(), dx.get(), pos.get(), inv_freq.get(), kTokens, kHeads, kHeadDim,
                                kHeadDim, 1.f, ctx().stream);
    });
  });
}

// fwd: out = act(gate) * up (3 arrays); bwd: dgate, dup from gate, up, dout (5 arrays); bwd_value:
// the same plus act(gate) * up written over dout (6 arrays: glu_lora_linear's activation backward).
template <void (*Fwd)(const bf16*, const bf16*, bf16*, int64_t, Stream),
          void (*Bwd)(const bf16*, const bf16*, const bf16*, bf16*, bf16*, int64_t, Stream, bf16*)>
void register_glu(const std::string& base) {
  const int64_t n = kMlpTokens * kIntermediate;
  const std::string shape = "/bf16/" + x2(kMlpTokens, kIntermediate);
  add(base + "_fwd" + shape, [=](benchmark::State& st) {
    auto gate = random_array<bf16>(n, -4.f, 4.f), up = random_array<bf16>(n);
    DeviceArray<bf16> out(n);
    run_timed(st, {6.0 * n}, [&] { Fwd(gate.get(), up.get(), out.get(), n, ctx().stream); });
  });
  add(base + "_bwd" + shape, [=](benchmark::State& st) {
    auto gate = random_array<bf16>(n, -4.f, 4.f), up = random_array<bf16>(n), dout = random_array<bf16>(n);
    DeviceArray<bf16> dgate(n), dup(n);
    run_timed(st, {10.0 * n},
              [&] { Bwd(gate.get(), up.get(), dout.get(), dgate.get(), dup.get(), n, ctx().stream, nullptr); });
  });
  add(base + "_bwd_value" + shape, [=](benchmark::State& st) {
    auto gate = random_array<bf16>(n, -4.f, 4.f), up = random_array<bf16>(n), dout = random_array<bf16>(n);
    DeviceArray<bf16> dgate(n), dup(n);
    run_timed(st, {12.0 * n}, [&] {
      Bwd(gate.get(), up.get(), dout.get(), dgate.get(), dup.get(), n, ctx().stream, dout.get());
    });
  });
}

void register_embedding() {
  const int64_t n = kTokens, dim = kHidden;
  const std::string shape = "/bf16/" + x2(n, dim) + "/vocab" + std::to_string(kVocab);
  add("embedding_fwd" + shape, [=](benchmark::State& st) {
    auto ids = random_ints(n, kVocab, 1);
    auto table = random_array<bf16>(kVocab * dim);
    DeviceArray<bf16> out(n * dim);
    run_timed(st, {4.0 * n + 4.0 * n * dim}, [&] {
      cuda::embedding_forward<bf16>(ids.get(), table.get(), out.get(), n, kVocab, dim, ctx().stream);
    });
  });
  // dtable (f32) += scatter(dout): bytes count dout and ids once and each touched dtable row read
  // and written once (ids are nearly all distinct: 16384 draws from 128256).
  add("embedding_bwd" + shape, [=](benchmark::State& st) {
    auto ids = random_ints(n, kVocab, 2);
    auto dout = random_array<bf16>(n * dim);
    auto dtable = random_array<float>(kVocab * dim);
    run_timed(st, {4.0 * n + 2.0 * n * dim + 8.0 * n * dim}, [&] {
      cuda::embedding_backward<bf16>(ids.get(), dout.get(), dtable.get(), n, kVocab, dim, ctx().stream);
    });
  });
}

}  // namespace

void register_nn() {
  register_rms_norm();
  register_rope();
  register_glu<cuda::swiglu_forward<bf16>, cuda::swiglu_backward<bf16>>("swiglu");
  register_glu<cuda::geglu_forward<bf16>, cuda::geglu_backward<bf16>>("geglu");
  register_embedding();
}

}  // namespace loom::bench
