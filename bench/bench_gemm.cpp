// Benchmarks of loom::cuda::gemm (cuBLASLt): square bf16 and f32 products, the three products of
// a Llama-7B MLP up/gate projection (8192 tokens, hidden 4096, intermediate 11008), and the base
// products of a LoRA step on the Llama-3.2-1B shape (8 x 2048 tokens, accumulating as the models run
// them) with the heuristic's algorithm and with the timed choice (GemmAlgoChoice), side by side.
#include <string>
#include <utility>

#include "bench/bench_util.h"
#include "kernels/gemm.h"

namespace loom::bench {
namespace {

// C [m, n] = op(A) op(B); A stored [m, k] ([k, m] when ta), B stored [k, n] ([n, k] when tb).
void add_gemm(const std::string& name, int64_t m, int64_t n, int64_t k, bool ta, bool tb, GemmType type,
              float beta = 0.f, cuda::GemmAlgoChoice choice = cuda::GemmAlgoChoice::kHeuristic) {
  add(name, [=](benchmark::State& st) {
    GemmArgs g;
    g.m = m, g.n = n, g.k = k;
    g.trans_a = ta, g.trans_b = tb;
    g.ab_type = g.c_type = type;
    g.lda = ta ? m : k;
    g.ldb = tb ? k : n;
    g.ldc = n;
    g.beta = beta;
    const BenchContext& c = ctx();
    auto run = [&](auto zero) {
      using T = decltype(zero);
      auto a = random_array<T>(m * k), b = random_array<T>(k * n);
      DeviceArray<T> out(m * n);
      g.a = a.get(), g.b = b.get(), g.c = out.get();
      run_timed(st, {0, 2.0 * double(m) * double(n) * double(k), Bound::kCompute},
                [&] { cuda::gemm(g, c.cublaslt, c.gemm_ws, c.stream, choice); });
    };
    if (type == GemmType::kBF16) {
      run(bf16{});
    } else {
      run(0.f);
    }
  });
}

std::string mnk(int64_t m, int64_t n, int64_t k) {
  return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
}

}  // namespace

void register_gemm() {
  // Names give m x n x k.
  add_gemm("gemm/bf16/" + mnk(4096, 4096, 4096), 4096, 4096, 4096, false, false, GemmType::kBF16);
  add_gemm("gemm/bf16/" + mnk(8192, 8192, 8192), 8192, 8192, 8192, false, false, GemmType::kBF16);
  // Forward: y [8192, 11008] = x [8192, 4096] W^T, W stored [11008, 4096] as in the checkpoint.
  add_gemm("gemm/bf16/llama7b_mlp_fwd/" + mnk(8192, 11008, 4096), 8192, 11008, 4096, false, true, GemmType::kBF16);
  // Input gradient: dx [8192, 4096] = dy [8192, 11008] W [11008, 4096].
  add_gemm("gemm/bf16/llama7b_mlp_dgrad/" + mnk(8192, 4096, 11008), 8192, 4096, 11008, false, false,
           GemmType::kBF16);
  // Weight gradient: dW [11008, 4096] = dy^T x, dy stored [8192, 11008].
  add_gemm("gemm/bf16/llama7b_mlp_wgrad/" + mnk(11008, 4096, 8192), 11008, 4096, 8192, true, false,
           GemmType::kBF16);
  // Llama-3.2-1B's base products in a LoRA step, 16384 tokens, beta 1 (the adapter's product is written
  // first and the base GEMM adds onto it: autograd/fn_lora.cpp): forward y = x W^T, input gradient dx = dy W.
  struct Proj {
    const char* name;
    int64_t out, in;
  };
  for (const Proj& p : {Proj{"q_o", 2048, 2048}, Proj{"k_v", 512, 2048}, Proj{"gate_up", 8192, 2048},
                        Proj{"down", 2048, 8192}}) {
    for (auto [choice, tag] : {std::pair{cuda::GemmAlgoChoice::kHeuristic, "heuristic"},
                               std::pair{cuda::GemmAlgoChoice::kTimed, "timed"}}) {
      const std::string pre = std::string("gemm/bf16/llama1b_") + p.name;
      add_gemm(pre + "_fwd/" + mnk(16384, p.out, p.in) + "/" + tag, 16384, p.out, p.in, false, true, GemmType::kBF16,
               1.f, choice);
      add_gemm(pre + "_dgrad/" + mnk(16384, p.in, p.out) + "/" + tag, 16384, p.in, p.out, false, false,
               GemmType::kBF16, 1.f, choice);
    }
  }
  // f32 without TF32 (CUBLAS_COMPUTE_32F): the SIMT rate, far below the bf16 roofline.
  add_gemm("gemm/f32/" + mnk(4096, 4096, 4096), 4096, 4096, 4096, false, false, GemmType::kF32);
}

}  // namespace loom::bench
