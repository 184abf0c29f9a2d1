// CPU NF4 kernels against bitsandbytes 0.50.2's own quantize_4bit / dequantize_4bit on an H200
// (tests/fixtures/bnb/nf4.safetensors, tools/reference/make_bnb_reference.py), and against the definition of
// the code book (nearest code, padding, all-zero blocks).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "engine/tensor_io.h"
#include "kernels/dynamic_map.h"
#include "kernels/nf4.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

const std::string kFixture = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/bnb/nf4.safetensors";

const std::map<std::string, Tensor>& fixture() {
  static const std::map<std::string, Tensor> t = [] {
    auto r = load_tensors(kFixture);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *std::move(r) : std::map<std::string, Tensor>{};
  }();
  return t;
}

template <class T>
std::vector<T> get(const std::string& key) {
  const auto& f = fixture();
  auto it = f.find(key);
  EXPECT_NE(it, f.end()) << key << " missing from " << kFixture;
  if (it == f.end()) return {};
  const Tensor c = it->second.contiguous();
  const T* p = c.data<T>();
  return std::vector<T>(p, p + c.numel());
}

template <class T>
int64_t bit_mismatches(const std::vector<T>& a, const std::vector<T>& b) {
  EXPECT_EQ(a.size(), b.size());
  int64_t bad = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return bad;
}

TEST(Nf4Bnb, CodeBooksEqualBitsandbytes) {
  const auto quant_map = get<float>("f32.quant_map");
  ASSERT_EQ(quant_map.size(), 16u);
  EXPECT_EQ(bit_mismatches(quant_map, std::vector<float>(kNf4Code, kNf4Code + 16)), 0);
  std::vector<float> dyn(256);
  dynamic_map(true, dyn.data());
  EXPECT_EQ(bit_mismatches(get<float>("f32.nested_quant_map"), dyn), 0);
}

template <class T>
class Nf4BnbCase : public ::testing::Test {
 protected:
  static std::string key(const char* field) { return std::string(std::is_same_v<T, float> ? "f32." : "bf16.") + field; }
};
using InputTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(Nf4BnbCase, InputTypes);

// The block absmax is an exact maximum: bit-equal. The codes: bitsandbytes multiplies by its
// reciprocal 1/absmax, computed under --use_fast_math (MUFU.RCP, within 1 ulp of IEEE), where Loom
// divides exactly. A code may therefore differ only where x * inv lands on the other side of a
// decision threshold for one of the two neighbouring reciprocals; every mismatch must be of that
// kind (checked here), and there must be few (none on this fixture when it was made).
TYPED_TEST(Nf4BnbCase, PackedCodesAndAbsmaxEqualBitsandbytes) {
  using T = TypeParam;
  const auto x = get<T>(this->key("input"));
  const int64_t n = static_cast<int64_t>(x.size());
  ASSERT_EQ(n, 300 * 64);
  std::vector<uint8_t> packed(nf4_packed_bytes(n));
  std::vector<float> absmax(nf4_blocks(n));
  cpu::nf4_quantize(x.data(), n, packed.data(), absmax.data());
  EXPECT_EQ(bit_mismatches(absmax, get<float>(this->key("plain_absmax"))), 0);
  for (const char* field : {"plain_packed", "packed"}) {  // the codes do not depend on compress_statistics
    const auto want = get<uint8_t>(this->key(field));
    ASSERT_EQ(want.size(), packed.size());
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int shift = (i & 1) ? 0 : 4;
      const int got_c = (packed[i / 2] >> shift) & 15, want_c = (want[i / 2] >> shift) & 15;
      if (got_c == want_c) continue;
      ++differ;
      const float m = absmax[i / kNf4Block], v = static_cast<float>(to_acc(x[i]));
      const float inv = 1.0f / m;
      const bool explained = nf4_code_of(v * std::nextafter(inv, 0.f)) == want_c ||
                             nf4_code_of(v * std::nextafter(inv, INFINITY)) == want_c;
      EXPECT_TRUE(explained) << field << " element " << i << ": code " << got_c << ", bitsandbytes " << want_c
                             << " (x " << v << ", absmax " << m << ")";
    }
    EXPECT_LE(differ, n / 10000) << field << ": reciprocal-rounding differences should be rare";
  }
}

// The offset is a mean whose summation order differs (torch's CUDA reduction vs Loom's f64 sum):
// within 4 ulps. Given bitsandbytes' offset, the 8-bit absmax codes and the second-level absmax are
// bit-equal (the nested step uses the same reciprocal argument as above; it has no slack here).
TYPED_TEST(Nf4BnbCase, DoubleQuantisationEqualsBitsandbytes) {
  const auto absmax = get<float>(this->key("plain_absmax"));
  const int64_t blocks = static_cast<int64_t>(absmax.size());
  const float bnb_offset = get<float>(this->key("offset")).at(0);
  const float offset = cpu::nf4_absmax_mean(absmax.data(), blocks);
  EXPECT_LE(std::abs(offset - bnb_offset), 4 * (std::nextafter(bnb_offset, INFINITY) - bnb_offset))
      << "offset " << offset << " vs bitsandbytes " << bnb_offset;
  std::vector<float> code(256);
  dynamic_map(true, code.data());
  std::vector<uint8_t> q(blocks);
  std::vector<float> nested((blocks + kNf4NestedBlock - 1) / kNf4NestedBlock);
  cpu::nf4_double_quantize(absmax.data(), blocks, bnb_offset, code.data(), q.data(), nested.data());
  EXPECT_EQ(q, get<uint8_t>(this->key("absmax")));
  EXPECT_EQ(bit_mismatches(nested, get<float>(this->key("nested_absmax"))), 0);
  // With Loom's own offset (what a fresh quantisation writes): the same codes here.
  std::vector<uint8_t> q_own(blocks);
  std::vector<float> nested_own(nested.size());
  cpu::nf4_double_quantize(absmax.data(), blocks, offset, code.data(), q_own.data(), nested_own.data());
  EXPECT_EQ(q_own, q);
}

// Dequantisation is deterministic in bitsandbytes (one f32 product per element, and for the nested
// state one product and one sum per block): bit-equal, f32 and bf16 outputs.
TYPED_TEST(Nf4BnbCase, DequantiseEqualsBitsandbytes) {
  using T = TypeParam;
  const auto packed = get<uint8_t>(this->key("packed"));
  const int64_t n = static_cast<int64_t>(packed.size()) * 2;
  const auto qabsmax = get<uint8_t>(this->key("absmax"));
  const auto nested = get<float>(this->key("nested_absmax"));
  const auto code = get<float>(this->key("nested_quant_map"));
  Nf4State st;
  st.qabsmax = qabsmax.data();
  st.nested_absmax = nested.data();
  st.nested_code = code.data();
  st.offset = get<float>(this->key("offset")).at(0);
  std::vector<T> out(n);
  cpu::nf4_dequantize(packed.data(), st, n, out.data());
  EXPECT_EQ(bit_mismatches(out, get<T>(this->key("dequantized"))), 0);

  const auto plain_packed = get<uint8_t>(this->key("plain_packed"));
  const auto plain_absmax = get<float>(this->key("plain_absmax"));
  Nf4State plain;
  plain.absmax = plain_absmax.data();
  cpu::nf4_dequantize(plain_packed.data(), plain, n, out.data());
  EXPECT_EQ(bit_mismatches(out, get<T>(this->key("plain_dequantized"))), 0);
}

// Independent of bitsandbytes' dumps: the decision tree picks the nearest code (its thresholds are
// the f32-rounded midpoints, so within 1e-6 of a midpoint either neighbour is accepted).
TEST(Nf4, CodeOfIsTheNearestCode) {
  const auto xs = random_vec<float>(50000, 11, -1.f, 1.f);
  for (float x : xs) {
    int best = 0;
    for (int c = 1; c < 16; ++c)
      if (std::abs(double(kNf4Code[c]) - x) < std::abs(double(kNf4Code[best]) - x)) best = c;
    const int got = nf4_code_of(x);
    if (got == best) continue;
    EXPECT_NEAR(std::abs(double(kNf4Code[got]) - x), std::abs(double(kNf4Code[best]) - x), 1e-6) << x;
  }
  for (int c = 0; c < 16; ++c) EXPECT_EQ(nf4_code_of(kNf4Code[c]), c) << "every code maps to itself";
  EXPECT_EQ(nf4_code_of(NAN), 0);
}

// Odd length: the last byte's low nibble is the code of a 0 pad. An all-zero block: 0 * (1/0) is
// NaN, code 0 (-1.0), which dequantises to -0.0 times a zero absmax, as in bitsandbytes.
TEST(Nf4, PaddingAndZeroBlocks) {
  std::vector<float> x(64 + 5, 0.f);
  for (int i = 64; i < 69; ++i) x[i] = 0.1f * (i - 66);
  std::vector<uint8_t> packed(nf4_packed_bytes(69));
  std::vector<float> absmax(2);
  cpu::nf4_quantize(x.data(), 69, packed.data(), absmax.data());
  EXPECT_EQ(absmax[0], 0.f);
  EXPECT_FLOAT_EQ(absmax[1], 0.2f);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(packed[j], 0x00) << j;
  EXPECT_EQ(packed[34] & 0x0f, 0b0111) << "pad of the odd element is code(0)";
  EXPECT_EQ(packed[34] >> 4, 0b1111) << "x[68] = 0.2 = absmax";
  std::vector<float> out(69);
  Nf4State st;
  st.absmax = absmax.data();
  cpu::nf4_dequantize(packed.data(), st, 69, out.data());
  EXPECT_TRUE(std::signbit(out[0]) && out[0] == 0.f);
  EXPECT_EQ(out[64], -0.2f);
  EXPECT_EQ(out[66], 0.f);
}

// A round trip's error: |code - x / absmax| <= half NF4's widest gap (1 - 0.6961928) / 2 < 0.1520,
// and the double-quantised absmax is off by at most half the widest step of the 8-bit map
// (0.9 / 64 / 2 < 0.00704) times the second-level absmax.
TEST(Nf4, DoubleQuantisedRoundTripError) {
  const int64_t n = 64 * 700 + 3;
  const auto x = random_vec<float>(n, 5, -0.05f, 0.05f);
  std::vector<uint8_t> packed(nf4_packed_bytes(n));
  const int64_t blocks = nf4_blocks(n);
  std::vector<float> absmax(blocks), nested(nf4_nested_blocks(n)), code(256), out(n);
  std::vector<uint8_t> q(blocks);
  cpu::nf4_quantize(x.data(), n, packed.data(), absmax.data());
  const float offset = cpu::nf4_absmax_mean(absmax.data(), blocks);
  dynamic_map(true, code.data());
  cpu::nf4_double_quantize(absmax.data(), blocks, offset, code.data(), q.data(), nested.data());
  Nf4State st{nullptr, q.data(), nested.data(), code.data(), offset};
  cpu::nf4_dequantize(packed.data(), st, n, out.data());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i / kNf4Block;
    const double m = absmax[b], a = nf4_block_absmax(st, b);
    ASSERT_LE(std::abs(a - m), 0.00704 * nested[b / kNf4NestedBlock] + 1e-8) << "block " << b;
    ASSERT_LE(std::abs(out[i] - double(x[i])), 0.1520 * m + std::abs(a - m) + 1e-8) << i;
  }
}

}  // namespace
}  // namespace loom::test
