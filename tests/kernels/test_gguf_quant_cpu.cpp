// GGUF dequantisation and Q8_0 quantisation against the `gguf` Python package: blocks and the f32
// values gguf.quants.dequantize gave for them (tools/reference/make_gguf_fixtures.py). Both sides compute each
// element as one or two f32 products/sums of the same operands, so the results must be bit-identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/gguf_quant.h"

namespace loom {
namespace {

std::vector<uint8_t> read_file(const std::string& name) {
  const std::string path = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/gguf/quant/" + name;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "missing fixture " << path << " (run tools/reference/make_gguf_fixtures.py)";
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<float> as_floats(const std::vector<uint8_t>& b) {
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), f.size() * 4);
  return f;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

class Dequantize : public ::testing::TestWithParam<GgmlType> {};

TEST_P(Dequantize, MatchesGgufPy) {
  const GgmlType type = GetParam();
  const std::string name(ggml_type_name(type));
  const std::vector<uint8_t> blocks = read_file(name + ".blocks");
  const std::vector<float> expected = as_floats(read_file(name + ".f32"));
  const auto tr = ggml_type_traits(static_cast<uint32_t>(type));
  ASSERT_TRUE(tr && tr->dequantizable);
  ASSERT_EQ(blocks.size() % tr->block_bytes, 0u);
  const int64_t n = static_cast<int64_t>(blocks.size() / tr->block_bytes) * tr->block_elems;
  ASSERT_EQ(static_cast<size_t>(n), expected.size());
  std::vector<float> got(n);
  cpu::dequantize_row(type, blocks.data(), got.data(), n);
  int mismatches = 0;
  for (int64_t i = 0; i < n && mismatches < 10; ++i)
    if (bits(got[i]) != bits(expected[i])) {
      ++mismatches;
      ADD_FAILURE() << name << " element " << i << " (block " << i / tr->block_elems << "): got " << got[i]
                    << ", gguf-py " << expected[i];
    }
}

INSTANTIATE_TEST_SUITE_P(EveryType, Dequantize,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                                           GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K),
                         [](const auto& info) { return std::string(ggml_type_name(info.param)); });

TEST(QuantizeQ8_0, BitExactWithGgufPy) {
  const std::vector<float> x = as_floats(read_file("Q8_0_quantize.input.f32"));
  const std::vector<uint8_t> expected = read_file("Q8_0_quantize.blocks");
  ASSERT_EQ(x.size() % kQK, 0u);
  std::vector<BlockQ8_0> q(x.size() / kQK);
  cpu::quantize_row_q8_0(x.data(), q.data(), static_cast<int64_t>(x.size()));
  ASSERT_EQ(expected.size(), q.size() * sizeof(BlockQ8_0));
  EXPECT_EQ(std::memcmp(expected.data(), q.data(), expected.size()), 0);
  for (size_t b = 0; b < q.size(); ++b) {
    BlockQ8_0 e;
    std::memcpy(&e, expected.data() + b * sizeof e, sizeof e);
    EXPECT_EQ(q[b].d, e.d) << "block " << b;
    for (int j = 0; j < kQK; ++j) EXPECT_EQ(q[b].qs[j], e.qs[j]) << "block " << b << " element " << j;
  }
}

TEST(QuantizeQ8_0, RoundTripErrorIsBelowHalfAStep) {
  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * (1.f + static_cast<float>(i % 7));
  std::vector<BlockQ8_0> q(x.size() / kQK);
  cpu::quantize_row_q8_0(x.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  cpu::dequantize_row(GgmlType::Q8_0, q.data(), y.data(), static_cast<int64_t>(y.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    // |x - q d| <= d/2 from rounding, plus the rounding of d to f16 (relative 2^-11 of max|x| = 127 d).
    const float d = fp16_to_f32(q[i / kQK].d);
    EXPECT_LE(std::fabs(x[i] - y[i]), 0.5f * d + 127.f * d * 0x1p-11f) << i;
  }
}

TEST(Fp16, RoundingMatchesNumpy) {
  const std::vector<float> x = as_floats(read_file("f16_round.input.f32"));
  const std::vector<uint8_t> b = read_file("f16_round.bits");
  ASSERT_EQ(b.size(), x.size() * 2);
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t e;
    std::memcpy(&e, b.data() + 2 * i, 2);
    EXPECT_EQ(f32_to_fp16(x[i]), e) << "value " << x[i] << " (#" << i << ")";
  }
}

TEST(Fp16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;  // NaNs: payloads need not survive
    EXPECT_EQ(f32_to_fp16(fp16_to_f32(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(GgmlTypes, TraitsAndMisuse) {
  EXPECT_FALSE(ggml_type_traits(4).has_value());  // ids 4 and 5 were removed from ggml
  EXPECT_FALSE(ggml_type_traits(1000).has_value());
  EXPECT_EQ(ggml_type_traits(12)->block_bytes, static_cast<int>(sizeof(BlockQ4_K)));
  EXPECT_EQ(ggml_type_traits(14)->block_bytes, static_cast<int>(sizeof(BlockQ6_K)));
  std::vector<float> out(256);
  std::vector<uint8_t> in(1024);
  EXPECT_THROW(cpu::dequantize_row(GgmlType::Q2_K, in.data(), out.data(), 256), Error);
  EXPECT_THROW(cpu::dequantize_row(GgmlType::Q8_0, in.data(), out.data(), 31), Error);
}

}  // namespace
}  // namespace loom
