// Benchmark of the fused linear + cross-entropy (lm_head + loss, no [tokens, vocab] logits) at the
// Llama 3 8B shape: forward + backward with W frozen (dh) or trained (dh and dW), against the GEMM
// rate, with the device memory it takes above its inputs (names match bench/peer_torch.py).
#include <cuda_runtime.h>

#include <string>

#include "bench/bench_util.h"
#include "kernels/cross_entropy.h"  // kIgnoreIndex
#include "kernels/linear_cross_entropy.h"

namespace loom::bench {
namespace {

size_t used_device_bytes() {
  size_t free = 0, total = 0;
  LOOM_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return total - free;
}

// n rows of h [n, hidden] against W [vocab, hidden], bf16, uniform targets (none ignored).
void register_linear_cross_entropy(int64_t n, int64_t vocab, int64_t hidden) {
  const std::string shape = "/bf16/" + std::to_string(n) + "x" + std::to_string(vocab) + "x" + std::to_string(hidden);
  for (const bool train_w : {false, true}) {
    add("linear_cross_entropy_fwdbwd" + shape + (train_w ? "_trained" : "_frozen"), [=](benchmark::State& st) {
      // Inputs as peer_torch.py makes them: h in [-1, 1), W in [-0.02, 0.02) (logits of O(1)).
      auto h = random_array<bf16>(size_t(n * hidden));
      auto w = random_array<bf16>(size_t(vocab * hidden), -0.02f, 0.02f);
      auto targets = random_ints(size_t(n), static_cast<int32_t>(vocab), 7);
      LOOM_CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
      // Everything allocated from here on is what one step costs above its inputs: the loss, dh
      // (bf16), dW (f32, trained only) and the scratch (row scale, row losses, one chunk's logits).
      const size_t before = used_device_bytes();
      DeviceArray<float> loss(1);
      DeviceArray<bf16> dh(size_t(n * hidden));
      DeviceArray<float> dw(train_w ? size_t(vocab * hidden) : 1);
      const int64_t chunk = linear_cross_entropy_chunk_rows(n, vocab, 0, true);
      DeviceArray<uint8_t> scratch(cuda::linear_cross_entropy_scratch_bytes(n, vocab, chunk, true));
      // Forward logits GEMM and dh GEMM; the dW GEMM when trained: 2 n vocab hidden FLOPs each.
      const double gemm = 2.0 * double(n) * double(vocab) * double(hidden);
      Work work{0, (train_w ? 3.0 : 2.0) * gemm, Bound::kCompute};
      run_timed(st, work, [&] {
        cuda::linear_cross_entropy<bf16>(h.get(), w.get(), targets.get(), loss.get(), dh.get(),
                                         train_w ? dw.get() : nullptr, n, vocab, hidden, 0.f, kIgnoreIndex, chunk,
                                         scratch.get(), ctx().cublaslt, ctx().gemm_ws, ctx().stream);
      });
      LOOM_CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
      // Measured after the runs, so anything cuBLASLt kept for itself counts too.
      const double gib = double(1 << 30);
      st.counters["peak_GiB"] = double(used_device_bytes() - before) / gib;
      st.counters["extra_GiB"] = double(scratch.bytes()) / gib;  // beyond the inputs and the gradients
      st.counters["chunk_rows"] = double(chunk);
    });
  }
}

}  // namespace

void register_loss() { register_linear_cross_entropy(8192, 128256, 4096); }

}  // namespace loom::bench
