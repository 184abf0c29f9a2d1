// Benchmarks of causal GQA attention (forward, backward; against the GEMM rate) and of the
// softmax cross-entropy over Llama 2 and Llama 3 vocabularies (forward, backward; memory-bound).
#include <string>

#include "bench/bench_util.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"

namespace loom::bench {
namespace {

// Llama-3-8B-like attention: 32 query heads sharing 8 kv heads, head_dim 128.
constexpr int64_t kBatch = 4, kSeq = 2048, kHeads = 32, kKvHeads = 8, kHeadDim = 128;

AttentionParams attention_params() {
  AttentionParams p;
  p.batch = kBatch, p.seq = kSeq, p.heads = kHeads, p.kv_heads = kKvHeads, p.head_dim = kHeadDim;
  p.scale = 1.f / 11.313708498984761f;  // 1 / sqrt(128)
  return p;
}

// Causal FLOPs as FlashAttention counts them: visible (query, key) pairs s (s + 1) / 2 per
// (batch, head); forward two products (4 d FLOPs per pair), backward five (2.5x the forward).
double attention_flops(bool backward) {
  const double pairs = double(kSeq) * double(kSeq + 1) / 2.0;
  return (backward ? 10.0 : 4.0) * double(kBatch) * double(kHeads) * pairs * double(kHeadDim);
}

void register_attention_cases() {
  const int64_t nq = kBatch * kSeq * kHeads * kHeadDim, nkv = kBatch * kSeq * kKvHeads * kHeadDim;
  const int64_t nlse = kBatch * kHeads * kSeq;
  const std::string shape = "/bf16/b" + std::to_string(kBatch) + "_s" + std::to_string(kSeq) + "_h" +
                            std::to_string(kHeads) + "_kv" + std::to_string(kKvHeads) + "_d" +
                            std::to_string(kHeadDim);
  add("attention_fwd" + shape, [=](benchmark::State& st) {
    const AttentionParams p = attention_params();
    auto q = random_array<bf16>(nq), k = random_array<bf16>(nkv), v = random_array<bf16>(nkv);
    DeviceArray<bf16> out(nq);
    DeviceArray<float> lse(nlse);
    const double bytes = 2.0 * (2 * nq + 2 * nkv) + 4.0 * nlse;  // q, k, v read; out, lse written
    run_timed(st, {bytes, attention_flops(false), Bound::kCompute}, [&] {
      cuda::attention_forward<bf16>(p, q.get(), k.get(), v.get(), out.get(), lse.get(), ctx().stream);
    });
  });
  add("attention_bwd" + shape, [=](benchmark::State& st) {
    const AttentionParams p = attention_params();
    auto q = random_array<bf16>(nq), k = random_array<bf16>(nkv), v = random_array<bf16>(nkv);
    auto dout = random_array<bf16>(nq);
    DeviceArray<bf16> out(nq), dq(nq), dk(nkv), dv(nkv);
    DeviceArray<float> lse(nlse);
    DeviceArray<uint8_t> ws(cuda::attention_backward_workspace_bytes(p));
    cuda::attention_forward<bf16>(p, q.get(), k.get(), v.get(), out.get(), lse.get(), ctx().stream);
    // q, k, v, out, dout, lse read; dq, dk, dv written.
    const double bytes = 2.0 * (3 * nq + 2 * nkv) + 4.0 * nlse + 2.0 * (nq + 2 * nkv);
    run_timed(st, {bytes, attention_flops(true), Bound::kCompute}, [&] {
      cuda::attention_backward<bf16>(p, q.get(), k.get(), v.get(), out.get(), dout.get(), lse.get(), dq.get(),
                                     dk.get(), dv.get(), ws.get(), ctx().stream);
    });
  });
}

void register_cross_entropy_cases(int64_t n, int64_t vocab) {
  const std::string shape = "/bf16/" + std::to_string(n) + "x" + std::to_string(vocab);
  const int64_t nl = n * vocab;
  add("cross_entropy_fwd" + shape, [=](benchmark::State& st) {
    auto logits = random_array<bf16>(nl, -8.f, 8.f);
    auto targets = random_ints(n, static_cast<int32_t>(vocab), 3);
    DeviceArray<float> loss(n), lse(n);
    run_timed(st, {2.0 * nl + 4.0 * n + 8.0 * n}, [&] {
      cuda::cross_entropy_forward<bf16>(logits.get(), targets.get(), loss.get(), lse.get(), n, vocab, 0.f,
                                        kIgnoreIndex, ctx().stream);
    });
  });
  add("cross_entropy_bwd" + shape, [=](benchmark::State& st) {
    auto logits = random_array<bf16>(nl, -8.f, 8.f);
    auto targets = random_ints(n, static_cast<int32_t>(vocab), 4);
    auto dloss = random_array<float>(n, 0.5f, 1.f);
    DeviceArray<float> loss(n), lse(n);
    DeviceArray<bf16> dlogits(nl);
    cuda::cross_entropy_forward<bf16>(logits.get(), targets.get(), loss.get(), lse.get(), n, vocab, 0.f,
                                      kIgnoreIndex, ctx().stream);
    // logits read, dlogits written; targets, lse, dloss read.
    run_timed(st, {4.0 * nl + 12.0 * n}, [&] {
      cuda::cross_entropy_backward<bf16>(logits.get(), targets.get(), lse.get(), dloss.get(), dlogits.get(), n,
                                         vocab, 0.f, kIgnoreIndex, ctx().stream);
    });
  });
}

}  // namespace

void register_attention() {
  register_attention_cases();
  register_cross_entropy_cases(8192, 32000);   // Llama 2
  register_cross_entropy_cases(8192, 128256);  // Llama 3
}

}  // namespace loom::bench
