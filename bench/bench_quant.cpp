// Benchmarks of NF4 (kernels/nf4.h) on the Llama-3-8B MLP weight shape [14336, 4096]: dequantise
// (double-quantised state, bf16 and f32 out) against the copy roofline, and quantise. Memory-bound.
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/dynamic_map.h"
#include "kernels/nf4.h"

namespace loom::bench {
namespace {

constexpr int64_t kOut = 14336, kIn = 4096, kN = kOut * kIn;

// A double-quantised NF4 weight of kN uniform values, made by the CUDA quantiser.
struct Nf4Fixture {
  DeviceArray<uint8_t> packed{size_t(nf4_packed_bytes(kN))}, qabsmax{size_t(nf4_blocks(kN))};
  DeviceArray<float> absmax{size_t(nf4_blocks(kN))}, nested{size_t(nf4_nested_blocks(kN))}, offset{1};
  DeviceArray<float> code;
  float host_offset = 0;
  static std::vector<float> map() {
    std::vector<float> c(256);
    dynamic_map(true, c.data());
    return c;
  }
  Nf4Fixture() : code(upload_floats(map())) {
    auto w = random_array<bf16>(kN, -0.05f, 0.05f);
    cuda::nf4_quantize(w.get(), kN, packed.get(), absmax.get(), ctx().stream);
    cuda::nf4_absmax_mean(absmax.get(), nf4_blocks(kN), offset.get(), ctx().stream);
    cuda::nf4_double_quantize(absmax.get(), nf4_blocks(kN), offset.get(), code.get(), qabsmax.get(), nested.get(),
                              ctx().stream);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(&host_offset, offset.get(), sizeof(float), cudaMemcpyDeviceToHost, ctx().stream));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
  }
  Nf4State state() const { return {nullptr, qabsmax.get(), nested.get(), code.get(), host_offset}; }
};

const std::string kShape = "/" + std::to_string(kOut) + "x" + std::to_string(kIn);

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

void add_quantize() {
  add("nf4_quantize/bf16" + kShape, [](benchmark::State& st) {
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
  add_quantize();
}

}  // namespace loom::bench
