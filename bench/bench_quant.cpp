// Benchmarks of NF4 (kernels/nf4.h) on the Llama-3-8B MLP weight shape [14336, 4096]: dequantise
// (double-quantised state, bf16 and f32 out) against the copy roofline, and quantise. Memory-bound.
// And a mixture-of-experts projection's 128 experts dequantised together against one by one.
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/dynamic_map.h"
#include "kernels/nf4.h"

namespace loom::bench {
namespace {

constexpr int64_t kOut = 14336, kIn = 4096, kN = kOut * kIn;

// A double-quantised NF4 weight of n (default kN) uniform values, made by the CUDA quantiser.
struct Nf4Fixture {
  int64_t n;
  DeviceArray<uint8_t> packed, qabsmax;
  DeviceArray<float> absmax, nested, offset{1};
  DeviceArray<float> code;
  float host_offset = 0;
  static std::vector<float> map() {
    std::vector<float> c(256);
    dynamic_map(true, c.data());
    return c;
  }
  explicit Nf4Fixture(int64_t count = kN)
      : n(count), packed(size_t(nf4_packed_bytes(count))), qabsmax(size_t(nf4_blocks(count))),
        absmax(size_t(nf4_blocks(count))), nested(size_t(nf4_nested_blocks(count))), code(upload_floats(map())) {
    auto w = random_array<bf16>(n, -0.05f, 0.05f);
    cuda::nf4_quantize(w.get(), n, packed.get(), absmax.get(), ctx().stream);
    cuda::nf4_absmax_mean(absmax.get(), nf4_blocks(n), offset.get(), ctx().stream);
    cuda::nf4_double_quantize(absmax.get(), nf4_blocks(n), offset.get(), code.get(), qabsmax.get(), nested.get(),
                              ctx().stream);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(&host_offset, offset.get(), sizeof(float), cudaMemcpyDeviceToHost, ctx().stream));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
  }
  Nf4State state() const { return {nullptr, qabsmax.get(), nested.get(), code.get(), host_offset}; }
};

constexpr char kShape[] = "/14336x4096";  // kOut x kIn
static_assert(kOut == 14336 && kIn == 4096);

template <class T>
void add_dequantize(const char* dtype) {
  add(std::string("nf4_dequantize/") + dtype + kShape, [](benchmark::State& st) {
    Nf4Fixture f;
    DeviceArray<T> out(kN);
    // packed codes and absmax codes read, the second-level absmax read, the weight written.
    const double bytes = double(nf4_packed_bytes(kN)) + double(nf4_blocks(kN)) + 4.0 * nf4_nested_blocks(kN) +
                         double(sizeof(T)) * kN;
    const Nf4State s = f.state();
    run_timed(st, {bytes}, [&] { cuda::nf4_dequantize<T>(f.packed.get(), s, kN, out.get(), ctx().stream); });
  });
}

// Qwen3-30B-A3B's gate_up experts, 128 x [1536, 2048], each quantised on its own (here: slices of
// one quantised tensor, each a whole weight of its own state), into one [128, 1536, 2048] bf16 buffer:
// cuda::nf4_dequantize_experts (a launch per 64 experts) against one nf4_dequantize per expert (what
// ExpertLinear ran before session 32).
void add_dequantize_experts(bool batched) {
  constexpr int64_t kExperts = 128, kExpertN = 1536 * 2048;
  add(std::string("nf4_dequantize_experts/bf16/128x1536x2048/") + (batched ? "batched" : "each"),
      [batched](benchmark::State& st) {
        Nf4Fixture f(kExperts * kExpertN);
        DeviceArray<bf16> out(size_t(kExperts * kExpertN));
        std::vector<const uint8_t*> packed;
        std::vector<Nf4State> states;
        std::vector<bf16*> outs;
        for (int64_t e = 0; e < kExperts; ++e) {
          Nf4State s = f.state();
          s.qabsmax += e * nf4_blocks(kExpertN);
          s.nested_absmax += e * nf4_nested_blocks(kExpertN);
          packed.push_back(f.packed.get() + e * nf4_packed_bytes(kExpertN));
          states.push_back(s);
          outs.push_back(out.get() + e * kExpertN);
        }
        const double bytes = double(kExperts) * (double(nf4_packed_bytes(kExpertN)) + double(nf4_blocks(kExpertN)) +
                                                 4.0 * nf4_nested_blocks(kExpertN) + 2.0 * kExpertN);
        run_timed(st, {bytes}, [&] {
          if (batched) {
            cuda::nf4_dequantize_experts<bf16>(packed, states, kExpertN, outs, ctx().stream);
          } else {
            for (int64_t e = 0; e < kExperts; ++e)
              cuda::nf4_dequantize<bf16>(packed[e], states[e], kExpertN, outs[e], ctx().stream);
          }
        });
      });
}

void add_quantize() {
  add(std::string("nf4_quantize/bf16") + kShape, [](benchmark::State& st) {
    Nf4Fixture f;
    auto w = random_array<bf16>(kN, -0.05f, 0.05f);
    const int64_t blocks = nf4_blocks(kN);
    // The weight read once; packed codes, f32 absmax (written, then read twice), codes and nested absmax.
    const double bytes = 2.0 * kN + double(nf4_packed_bytes(kN)) + 4.0 * 3 * blocks + double(blocks) +
                         4.0 * nf4_nested_blocks(kN);
    run_timed(st, {bytes}, [&] {
      cuda::nf4_quantize(w.get(), kN, f.packed.get(), f.absmax.get(), ctx().stream);
      cuda::nf4_absmax_mean(f.absmax.get(), blocks, f.offset.get(), ctx().stream);
      cuda::nf4_double_quantize(f.absmax.get(), blocks, f.offset.get(), f.code.get(), f.qabsmax.get(), f.nested.get(),
                                ctx().stream);
    });
  });
}

}  // namespace

void register_quant() {
  add_dequantize<bf16>("bf16");
  add_dequantize<float>("f32");
  add_dequantize_experts(true);
  add_dequantize_experts(false);
  add_quantize();
}

}  // namespace loom::bench
