// The LoRA backward's two skinny products of dy (kernels/lora_dy.h): the one-pass kernel against the
// two cuBLASLt GEMMs it replaces (dt = dy [B_hi, B_lo], db = dy^T [t_hi, t_lo], f32 out), at the
// shapes of Llama-3.2-1B at 8 x 2048 tokens (gate/up: out 8192; q/o/down: 2048) and Llama-3-8B at
// 4 x 2048 (gate/up: 14336), rank 16. Memory-bound: the minimal traffic is dy read once.
#include <string>

#include "bench/bench_util.h"
#include "kernels/lora_dy.h"

namespace loom::bench {
namespace {

constexpr int64_t kR = 16, kParts = 2;

void register_shape(const std::string& what, int64_t n, int64_t out) {
  const int64_t w = kParts * kR;
  const std::string shape = "/bf16/" + what + "_" + std::to_string(n) + "x" + std::to_string(out) + "_r16";
  // dy read once, B and t read, dt and db written (f32).
  const double bytes = 2.0 * n * out + 2.0 * (out + n) * w + 4.0 * (n + out) * kR;
  add("lora_dy_onepass" + shape, [=](benchmark::State& st) {
    auto dy = random_array<bf16>(n * out), b = random_array<bf16>(out * 3 * kR, -0.1f, 0.1f),
         t = random_array<bf16>(n * w);
    DeviceArray<float> dt(n * kR), db(out * kR), work(cuda::lora_dy_products_workspace(n, out, kR, kParts));
    run_timed(st, {bytes}, [&] {
      cuda::lora_dy_products(dy.get(), out, b.get() + kR, 3 * kR, t.get(), w, n, out, kR, kParts, 0.5f, dt.get(),
                             db.get(), work.get(), ctx().stream);
    });
  });
  add("lora_dy_two_gemms" + shape, [=](benchmark::State& st) {
    auto dy = random_array<bf16>(n * out), b = random_array<bf16>(out * 3 * kR, -0.1f, 0.1f),
         t = random_array<bf16>(n * w);
    DeviceArray<float> dt(n * w), db(out * w);
    GemmArgs g1;  // dt parts [n, 2r] = dy [n, out] x B parts [out, 2r] (rows 3r apart)
    g1.m = n, g1.n = w, g1.k = out, g1.a = dy.get(), g1.lda = out, g1.b = b.get() + kR, g1.ldb = 3 * kR;
    g1.c = dt.get(), g1.ldc = w, g1.ab_type = GemmType::kBF16, g1.c_type = GemmType::kF32;
    GemmArgs g2;  // db parts [out, 2r] = dy^T [out, n] x t [n, 2r]
    g2.m = out, g2.n = w, g2.k = n, g2.trans_a = true, g2.a = dy.get(), g2.lda = out, g2.b = t.get(), g2.ldb = w;
    g2.c = db.get(), g2.ldc = w, g2.ab_type = GemmType::kBF16, g2.c_type = GemmType::kF32;
    const BenchContext& c = ctx();
    run_timed(st, {bytes}, [&] {
      cuda::gemm(g1, c.cublaslt, c.gemm_ws, c.stream);
      cuda::gemm(g2, c.cublaslt, c.gemm_ws, c.stream);
    });
  });
}

}  // namespace

void register_lora() {
  register_shape("llama1b_gate", 16384, 8192);
  register_shape("llama1b_q", 16384, 2048);
  register_shape("llama1b_k", 16384, 512);
  register_shape("llama8b_gate", 8192, 14336);
}

}  // namespace loom::bench
