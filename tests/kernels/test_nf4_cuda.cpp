// CUDA NF4 quantise, absmax mean, double quantise and dequantise against the CPU reference, bit for
// bit: f32 and bf16 inputs and outputs, partial blocks of 64 and of 256, odd lengths, all-zero
// blocks, and unaligned outputs (the scalar path).
#include <cstring>
#include <memory>

#include "kernels/dynamic_map.h"
#include "kernels/nf4.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

template <class T>
int64_t bit_mismatches(const std::vector<T>& a, const std::vector<T>& b) {
  EXPECT_EQ(a.size(), b.size());
  int64_t bad = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return bad;
}

template <class T>
class Nf4Cuda : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(Nf4Cuda, Types);

// Every step's output compared separately, so a failure names the step.
TYPED_TEST(Nf4Cuda, QuantiseAndDequantiseMatchCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  std::vector<float> code(256);
  dynamic_map(true, code.data());
  DeviceBuffer<float> dcode(code);
  for (int64_t n : {int64_t{1}, int64_t{63}, int64_t{64}, int64_t{65}, int64_t{64 * 300}, int64_t{64 * 257 + 7},
                    int64_t{4096 * 1000 + 16}, int64_t{64 * 1024 * 1100 + 32}}) {
    auto x = random_vec<T>(n, 3 + n, -0.08f, 0.08f);
    if (n > 256)
      for (int i = 128; i < 192; ++i) x[i] = from_acc<T>(0.f);  // an all-zero block
    if (n > 1000) x[777] = from_acc<T>(0.9f);                     // an outlier
    const int64_t blocks = nf4_blocks(n), nested = nf4_nested_blocks(n);
    std::vector<uint8_t> packed(nf4_packed_bytes(n)), q(blocks);
    std::vector<float> absmax(blocks), nabs(nested);
    cpu::nf4_quantize(x.data(), n, packed.data(), absmax.data());
    const float offset = cpu::nf4_absmax_mean(absmax.data(), blocks);
    cpu::nf4_double_quantize(absmax.data(), blocks, offset, code.data(), q.data(), nabs.data());

    DeviceBuffer<T> dx(x);
    DeviceBuffer<uint8_t> dpacked(packed.size()), dq(blocks);
    DeviceBuffer<float> dabsmax(blocks), dnabs(nested), doffset(1);
    cuda::nf4_quantize(dx.get(), n, dpacked.get(), dabsmax.get(), nullptr);
    cuda::nf4_absmax_mean(dabsmax.get(), blocks, doffset.get(), nullptr);
    cuda::nf4_double_quantize(dabsmax.get(), blocks, doffset.get(), dcode.get(), dq.get(), dnabs.get(), nullptr);
    EXPECT_EQ(bit_mismatches(dpacked.to_host(), packed), 0) << "packed n=" << n;
    EXPECT_EQ(bit_mismatches(dabsmax.to_host(), absmax), 0) << "absmax n=" << n;
    EXPECT_EQ(bit_mismatches(doffset.to_host(), std::vector<float>{offset}), 0) << "offset n=" << n;
    EXPECT_EQ(bit_mismatches(dq.to_host(), q), 0) << "qabsmax n=" << n;
    EXPECT_EQ(bit_mismatches(dnabs.to_host(), nabs), 0) << "nested absmax n=" << n;

    for (bool nested_state : {true, false}) {
      Nf4State cs, gs;
      if (nested_state) {
        cs = {nullptr, q.data(), nabs.data(), code.data(), offset};
        gs = {nullptr, dq.get(), dnabs.get(), dcode.get(), offset};
      } else {
        cs.absmax = absmax.data();
        gs.absmax = dabsmax.get();
      }
      for (int shift : {0, 1}) {  // shift 1: output not 16-byte aligned, the scalar kernel
        std::vector<T> want(n);
        cpu::nf4_dequantize(packed.data(), cs, n, want.data());
        DeviceBuffer<T> dout(n + 1);
        cuda::nf4_dequantize(dpacked.get(), gs, n, dout.get() + shift, nullptr);
        auto got = dout.to_host();
        got.erase(got.begin(), got.begin() + shift);
        got.resize(n);
        EXPECT_EQ(bit_mismatches(got, want), 0) << "dequantise n=" << n << " nested=" << nested_state
                                                << " shift=" << shift;
      }
    }
  }
}

// bf16 output of bf16-quantised data and f32 output of the same state agree after rounding: the
// f32 path rounds once to bf16 exactly as the bf16 kernel does.
// Experts dequantised together (nf4_dequantize_experts: a launch per 64, each quantised on its own)
// give each one's CPU dequantisation bit for bit: 70 experts (two chunks), whole tiles (the batched
// kernel) and a length off the tile (one launch each), double-quantised and plain.
TYPED_TEST(Nf4Cuda, ExpertsDequantiseAsEachAlone) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  std::vector<float> code(256);
  dynamic_map(true, code.data());
  DeviceBuffer<float> dcode(code);
  constexpr int kExperts = 70;
  for (int64_t n : {int64_t{3 * 16384}, int64_t{64 * 300}}) {
    const int64_t blocks = nf4_blocks(n), nested = nf4_nested_blocks(n);
    std::vector<std::vector<uint8_t>> packed(kExperts), q(kExperts);
    std::vector<std::vector<float>> absmax(kExperts), nabs(kExperts);
    std::vector<float> offset(kExperts);
    std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> dpacked, dq;
    std::vector<std::unique_ptr<DeviceBuffer<float>>> dabsmax, dnabs;
    for (int e = 0; e < kExperts; ++e) {
      auto x = random_vec<T>(n, 100 + e, -0.08f * (1 + e % 5), 0.08f * (1 + e % 5));  // offsets differ
      packed[e].resize(nf4_packed_bytes(n)), q[e].resize(blocks), absmax[e].resize(blocks), nabs[e].resize(nested);
      cpu::nf4_quantize(x.data(), n, packed[e].data(), absmax[e].data());
      offset[e] = cpu::nf4_absmax_mean(absmax[e].data(), blocks);
      cpu::nf4_double_quantize(absmax[e].data(), blocks, offset[e], code.data(), q[e].data(), nabs[e].data());
      dpacked.push_back(std::make_unique<DeviceBuffer<uint8_t>>(packed[e]));
      dq.push_back(std::make_unique<DeviceBuffer<uint8_t>>(q[e]));
      dabsmax.push_back(std::make_unique<DeviceBuffer<float>>(absmax[e]));
      dnabs.push_back(std::make_unique<DeviceBuffer<float>>(nabs[e]));
    }
    for (bool nested_state : {true, false}) {
      std::vector<T> want(n * kExperts);
      std::vector<const uint8_t*> gp;
      std::vector<Nf4State> gs;
      DeviceBuffer<T> dout(n * kExperts);
      std::vector<T*> outs;
      for (int e = 0; e < kExperts; ++e) {
        Nf4State cs, g;
        if (nested_state) {
          cs = {nullptr, q[e].data(), nabs[e].data(), code.data(), offset[e]};
          g = {nullptr, dq[e]->get(), dnabs[e]->get(), dcode.get(), offset[e]};
        } else {
          cs.absmax = absmax[e].data();
          g.absmax = dabsmax[e]->get();
        }
        cpu::nf4_dequantize(packed[e].data(), cs, n, want.data() + e * n);
        gp.push_back(dpacked[e]->get());
        gs.push_back(g);
        outs.push_back(dout.get() + e * n);
      }
      cuda::nf4_dequantize_experts(gp, gs, n, outs, nullptr);
      EXPECT_EQ(bit_mismatches(dout.to_host(), want), 0) << "experts n=" << n << " nested=" << nested_state;
    }
  }
}

TEST(Nf4CudaOutputs, Bf16IsTheRoundedF32) {
  LOOM_REQUIRE_GPU();
  const int64_t n = 64 * 513;
  const auto x = random_vec<float>(n, 9, -1.f, 1.f);
  std::vector<uint8_t> packed(nf4_packed_bytes(n));
  std::vector<float> absmax(nf4_blocks(n));
  cpu::nf4_quantize(x.data(), n, packed.data(), absmax.data());
  DeviceBuffer<uint8_t> dp(packed);
  DeviceBuffer<float> da(absmax), d32(n);
  DeviceBuffer<bf16> d16(n);
  Nf4State st;
  st.absmax = da.get();
  cuda::nf4_dequantize(dp.get(), st, n, d32.get(), nullptr);
  cuda::nf4_dequantize(dp.get(), st, n, d16.get(), nullptr);
  const auto f = d32.to_host();
  const auto b = d16.to_host();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b[i].bits, float_to_bf16(f[i]).bits) << i;
}

}  // namespace
}  // namespace loom::test
