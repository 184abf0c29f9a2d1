// ops::nf4_dequantize_experts_into (a mixture-of-experts projection's experts, each quantised on its
// own, dequantised into one [E, out, in] tensor) against ops::nf4_dequantize_into of each expert, on
// the CPU (CUDA's batched kernel: tests/kernels/test_nf4_cuda.cpp), and its misuse.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "engine/ops.h"

namespace loom {
namespace {

Tensor random(const Shape& s, uint32_t seed, double scale) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(-scale, scale);
  std::vector<double> v(numel_of(s));
  for (auto& x : v) x = d(gen);
  return Tensor::from_doubles(v, s).to(DType::f32);
}

TEST(OpsNf4, ExpertsDequantiseAsEachAlone) {
  constexpr int64_t kExperts = 3, kOut = 24, kIn = 40;  // 960 elements: blocks of 64 end mid-tensor
  for (bool double_quant : {true, false})
    for (DType dt : {DType::f32, DType::bf16}) {
      std::vector<ops::Nf4Parts> parts;
      for (int64_t e = 0; e < kExperts; ++e)
        parts.push_back(ops::nf4_quantize(random({kOut, kIn}, 7 + uint32_t(e), 0.1 * double(e + 1)), double_quant));
      Tensor all = Tensor::empty({kExperts, kOut, kIn}, dt);
      ops::nf4_dequantize_experts_into(parts, all);
      for (int64_t e = 0; e < kExperts; ++e) {
        Tensor one = Tensor::empty({kOut, kIn}, dt);
        ops::nf4_dequantize_into(parts[e], one);
        const Tensor got = all.narrow(0, e, 1).contiguous();
        ASSERT_EQ(std::memcmp(got.data_ptr(), one.data_ptr(), size_t(bytes_for(dt, one.numel()))), 0)
            << "expert " << e << " double_quant " << double_quant << " " << name(dt);
      }
    }
}

TEST(OpsNf4, ExpertsMisuseIsAnError) {
  const ops::Nf4Parts p = ops::nf4_quantize(random({8, 64}, 1, 0.1));
  Tensor wrong_count = Tensor::empty({3, 8, 64}, DType::f32);
  EXPECT_THROW(ops::nf4_dequantize_experts_into({p, p}, wrong_count), Error);  // 2 experts, 3 outputs
  Tensor wrong_size = Tensor::empty({2, 8, 32}, DType::f32);
  EXPECT_THROW(ops::nf4_dequantize_experts_into({p, p}, wrong_size), Error);  // 256 elements an expert, not 512
  Tensor wrong_type = Tensor::empty({2, 8, 64}, DType::f64);
  EXPECT_THROW(ops::nf4_dequantize_experts_into({p, p}, wrong_type), Error);
}

}  // namespace
}  // namespace loom
