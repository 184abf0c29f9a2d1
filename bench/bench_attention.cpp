// Benchmarks of causal GQA attention (forward, backward, both; against the GEMM rate; head dims,
// long sequences, sliding window, packed documents; device memory at 128k tokens), of each flash
// kernel by name on the shapes (flash_fwd/<kernel>/..., flash_bwd/<kernel>/...: how the
// dispatcher's choices in kernels/cuda/flash_attention.cu are checked), and of the softmax
// cross-entropy over Llama 2 and Llama 3 vocabularies (forward, backward; memory-bound).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/cuda/flash_attention.cuh"

namespace loom::bench {
namespace {

// One attention problem: Llama-3-8B-like heads (32 query heads sharing 8 kv heads) unless noted,
// optionally with a sliding window or packed documents of doc tokens each.
struct AttnShape {
  int64_t batch, seq, heads, kv_heads, head_dim, window = 0, doc = 0;

  std::string name() const {
    std::string n = "/bf16/b" + std::to_string(batch) + "_s" + std::to_string(seq) + "_h" + std::to_string(heads) +
                    "_kv" + std::to_string(kv_heads) + "_d" + std::to_string(head_dim);
    if (window > 0) n += "_w" + std::to_string(window);
    if (doc > 0) n += "_doc" + std::to_string(doc);
    return n;
  }
  AttentionParams params(const int32_t* segments) const {
    AttentionParams p;
    p.batch = batch, p.seq = seq, p.heads = heads, p.kv_heads = kv_heads, p.head_dim = head_dim;
    p.scale = 1.f / std::sqrt(float(head_dim));
    p.window = window;
    p.segment_ids = segments;
    return p;
  }
  // Visible (query, key) pairs per (batch, head): causal, inside the window and the document.
  double pairs() const {
    double n = 0;
    for (int64_t i = 0; i < seq; ++i) {
      int64_t lo = doc > 0 ? i / doc * doc : 0;
      if (window > 0) lo = std::max(lo, i - window + 1);
      n += double(i - lo + 1);
    }
    return n;
  }
  // FLOPs as FlashAttention counts them: forward two products (4 d per pair), backward five.
  double flops(double products) const { return 2.0 * products * double(batch * heads) * pairs() * double(head_dim); }
};

std::vector<int32_t> doc_segments(const AttnShape& a) {
  std::vector<int32_t> s(a.batch * a.seq);
  for (int64_t i = 0; i < a.batch * a.seq; ++i) s[i] = a.doc > 0 ? int32_t((i % a.seq) / a.doc) : 0;
  return s;
}

// Buffers of one forward + backward; device_bytes is what they take (inputs, outputs, workspace).
struct AttnBuffers {
  explicit AttnBuffers(const AttnShape& a)
      : nq(a.batch * a.seq * a.heads * a.head_dim), nkv(a.batch * a.seq * a.kv_heads * a.head_dim),
        nlse(a.batch * a.heads * a.seq), q(random_array<bf16>(nq)), k(random_array<bf16>(nkv)),
        v(random_array<bf16>(nkv)), dout(random_array<bf16>(nq)), out(nq), dq(nq), dk(nkv), dv(nkv), lse(nlse),
        seg(upload_ints(doc_segments(a))), p(a.params(a.doc > 0 ? seg.get() : nullptr)),
        ws(cuda::attention_backward_workspace_bytes(p)) {}
  void forward() { cuda::attention_forward<bf16>(p, q.get(), k.get(), v.get(), out.get(), lse.get(), ctx().stream); }
  void backward() {
    cuda::attention_backward<bf16>(p, q.get(), k.get(), v.get(), out.get(), dout.get(), lse.get(), dq.get(), dk.get(),
                                   dv.get(), ws.get(), ctx().stream);
  }
  // One flash kernel by name (throws, and so skips the benchmark, where it does not apply).
  void forward(cuda::flash::Kernel kernel) {
    cuda::flash::forward(p, q.get(), k.get(), v.get(), out.get(), lse.get(), ctx().stream, kernel);
  }
  void backward(cuda::flash::Kernel kernel) {
    cuda::flash::backward(p, q.get(), k.get(), v.get(), out.get(), dout.get(), lse.get(), dq.get(), dk.get(), dv.get(),
                          ws.get(), ctx().stream, kernel);
  }
  double device_bytes() const {
    return double(q.bytes() + k.bytes() + v.bytes() + dout.bytes() + out.bytes() + dq.bytes() + dk.bytes() +
                  dv.bytes() + lse.bytes() + seg.bytes() + ws.bytes());
  }
  int64_t nq, nkv, nlse;
  DeviceArray<bf16> q, k, v, dout, out, dq, dk, dv;
  DeviceArray<float> lse;
  DeviceArray<int32_t> seg;
  AttentionParams p;
  DeviceArray<uint8_t> ws;
};

void register_attention_case(const AttnShape& a, bool with_backward) {
  add("attention_fwd" + a.name(), [=](benchmark::State& st) {
    AttnBuffers b(a);
    const double bytes = 2.0 * double(2 * b.nq + 2 * b.nkv) + 4.0 * double(b.nlse);  // q, k, v in; out, lse
    run_timed(st, {bytes, a.flops(2), Bound::kCompute}, [&] { b.forward(); });
  });
  if (!with_backward) return;
  add("attention_bwd" + a.name(), [=](benchmark::State& st) {
    AttnBuffers b(a);
    b.forward();
    const double bytes = 2.0 * double(3 * b.nq + 2 * b.nkv) + 4.0 * double(b.nlse) + 2.0 * double(b.nq + 2 * b.nkv);
    run_timed(st, {bytes, a.flops(5), Bound::kCompute}, [&] { b.backward(); });
  });
  add("attention_fwdbwd" + a.name(), [=](benchmark::State& st) {
    AttnBuffers b(a);
    run_timed(st, {0, a.flops(7), Bound::kCompute}, [&] {
      b.forward();
      b.backward();
    });
    st.counters["device_GiB"] = b.device_bytes() / double(1 << 30);
  });
}

// flash_fwd/<kernel>/bf16/<shape> and flash_bwd/<kernel>/... (the backward after the dispatcher's
// forward), for the kernels that can run the shape on this GPU.
void register_flash_kernel_cases(const AttnShape& a) {
  using cuda::flash::Kernel;
  for (Kernel kernel : {Kernel::kMma, Kernel::kSm90, Kernel::kSm90Ws, Kernel::kSm90WsPersistent}) {
    const std::string tag = std::string("/") + cuda::flash::kernel_name(kernel);
    add("flash_fwd" + tag + a.name(), [=](benchmark::State& st) {
      AttnBuffers b(a);
      const double bytes = 2.0 * double(2 * b.nq + 2 * b.nkv) + 4.0 * double(b.nlse);
      run_timed(st, {bytes, a.flops(2), Bound::kCompute}, [&] { b.forward(kernel); });
    });
    add("flash_bwd" + tag + a.name(), [=](benchmark::State& st) {
      AttnBuffers b(a);
      b.forward();
      const double bytes = 2.0 * double(3 * b.nq + 2 * b.nkv) + 4.0 * double(b.nlse) + 2.0 * double(b.nq + 2 * b.nkv);
      run_timed(st, {bytes, a.flops(5), Bound::kCompute}, [&] { b.backward(kernel); });
    });
  }
}

void register_attention_cases() {
  const int64_t B = 4, S = 2048, H = 32, KV = 8;
  register_attention_case({B, S, H, KV, 128}, true);  // the target shape
  register_attention_case({B, S, H, KV, 64}, true);
  register_attention_case({8, S, H, KV, 64}, true);  // the 1B training shape: b4 hid what the dQ sum does there
  register_attention_case({B, S, 16, 8, 256}, true);  // Gemma-2-like heads
  register_attention_case({1, 8192, H, KV, 128}, true);
  register_attention_case({1, 32768, H, KV, 128}, true);
  register_attention_case({1, 8192, H, KV, 128, 4096}, true);  // Mistral's sliding window
  register_attention_case({B, S, H, KV, 128, 0, 512}, true);   // packed documents of 512 tokens
  register_attention_case({B, S, 8, 4, 256, 1024}, true);      // Gemma 3's sliding layers (4B: 8/4 heads)
  register_flash_kernel_cases({B, S, H, KV, 128});
  register_flash_kernel_cases({B, S, H, KV, 64});
  register_flash_kernel_cases({8, S, H, KV, 64});
  register_flash_kernel_cases({B, S, 16, 8, 256});
  register_flash_kernel_cases({B, S, H, KV, 128, 0, 512});
  register_flash_kernel_cases({1, 8192, H, KV, 128, 4096});
  register_flash_kernel_cases({B, S, 8, 4, 256, 1024});
  // Memory grows linearly with the sequence: one forward + backward at 128k tokens, timed once
  // (a run takes seconds; run_timed's warm-up and batching would triple that).
  add("attention_fwdbwd" + AttnShape{1, 131072, H, KV, 128}.name(), [](benchmark::State& st) {
    const AttnShape a{1, 131072, H, KV, 128};
    AttnBuffers b(a);
    cudaEvent_t e0, e1;
    LOOM_CUDA_CHECK(cudaEventCreate(&e0));
    LOOM_CUDA_CHECK(cudaEventCreate(&e1));
    for (auto _ : st) {
      LOOM_CUDA_CHECK(cudaEventRecord(e0, ctx().stream));
      b.forward();
      b.backward();
      LOOM_CUDA_CHECK(cudaEventRecord(e1, ctx().stream));
      LOOM_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      st.SetIterationTime(ms * 1e-3);
    }
    LOOM_CUDA_CHECK(cudaEventDestroy(e0));
    LOOM_CUDA_CHECK(cudaEventDestroy(e1));
    st.counters["flops_per_second"] = benchmark::Counter(a.flops(7), benchmark::Counter::kIsIterationInvariantRate);
    st.counters["device_GiB"] = b.device_bytes() / double(1 << 30);
  })->Iterations(1);
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
