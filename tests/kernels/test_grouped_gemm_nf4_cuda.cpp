// The Hopper grouped GEMM with NF4 weights (cuda::sm90_grouped_gemm_nf4) against the same kernel on
// the weights dequantised first (cpu::nf4_dequantize, the bitsandbytes-compatible reference, then
// cuda::sm90_grouped_gemm): the kernel writes the dequantised values into the tiles the bf16 path
// loads, so the outputs must agree bit for bit. Forward (y = x W^T) and input gradient (dx = dy W),
// both tile widths, bf16 and f32 outputs, beta 0 and 1, a LoRA term summed into the same output
// (dual), double-quantised (one shared nested code book, or one a weight) and plain absmax, experts
// without rows and row counts off the tile, and
// widths off the tile (out = 200: partial tiles of W's rows). The TMA-fed kernel's NF4 path
// (kernels/grouped_gemm_tma.h) likewise, against itself on the dequantised weights.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dynamic_map.h"
#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_tma.h"
#include "kernels/nf4.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

// E experts' weights W_e [out, in], quantised one by one, on the host and the device.
struct Nf4Experts {
  int64_t experts, out, in;
  std::vector<bf16> dense;  // [E, out, in], each expert's dequantisation (the reference's B)
  std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> packed, qabsmax;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> absmax, nested_absmax;
  std::unique_ptr<DeviceBuffer<float>> code;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> own_codes;  // one book a weight (bitsandbytes checkpoints)
  std::vector<Nf4Operand> weights;

  // own_books: each weight gets a copy of the nested code book of its own (the kernel then reads each
  // weight's; with one shared book it reads a shared-memory copy).
  Nf4Experts(int64_t e, int64_t o, int64_t i, bool nested, uint32_t seed, bool own_books = false)
      : experts(e), out(o), in(i) {
    const int64_t n = out * in, blocks = nf4_blocks(n), nblocks = nf4_nested_blocks(n);
    std::vector<float> book(256);
    dynamic_map(true, book.data());
    code = std::make_unique<DeviceBuffer<float>>(book);
    dense.resize(size_t(experts * n));
    for (int64_t x = 0; x < experts; ++x) {
      const std::vector<bf16> w = random_vec<bf16>(size_t(n), seed + uint32_t(x), -0.05f * (1 + x % 3), 0.05f * (1 + x % 3));
      std::vector<uint8_t> p(nf4_packed_bytes(n)), q(blocks);
      std::vector<float> a(blocks), na(nblocks);
      cpu::nf4_quantize(w.data(), n, p.data(), a.data());
      const float offset = cpu::nf4_absmax_mean(a.data(), blocks);
      cpu::nf4_double_quantize(a.data(), blocks, offset, book.data(), q.data(), na.data());
      Nf4State host, dev;
      packed.push_back(std::make_unique<DeviceBuffer<uint8_t>>(p));
      if (nested) {
        qabsmax.push_back(std::make_unique<DeviceBuffer<uint8_t>>(q));
        nested_absmax.push_back(std::make_unique<DeviceBuffer<float>>(na));
        host = {nullptr, q.data(), na.data(), book.data(), offset};
        if (own_books) own_codes.push_back(std::make_unique<DeviceBuffer<float>>(book));
        dev = {nullptr, qabsmax.back()->get(), nested_absmax.back()->get(),
               own_books ? own_codes.back()->get() : code->get(), offset};
      } else {
        absmax.push_back(std::make_unique<DeviceBuffer<float>>(a));
        host.absmax = a.data();
        dev.absmax = absmax.back()->get();
      }
      cpu::nf4_dequantize(p.data(), host, n, dense.data() + x * n);
      weights.push_back(Nf4Operand{packed.back()->get(), dev});
    }
  }
};

struct Case {
  bool forward;                  // y = x W^T (A [N, in]) or dx = dy W (A [N, out])
  std::vector<int64_t> offsets;  // E + 1 row offsets
  int64_t out, in;
  GemmType c_type;
  float beta;
  int64_t k2 = 0;  // a LoRA term's depth (dual list), 0: none
  bool nested = true;
  int tile_n = 128;
  bool own_books = false;
};

std::string describe(const Case& c) {
  return std::string(c.forward ? "fwd" : "dgrad") + " E=" + std::to_string(c.offsets.size() - 1) +
         " N=" + std::to_string(c.offsets.back()) + " out=" + std::to_string(c.out) + " in=" + std::to_string(c.in) +
         " C=" + gemm_type_name(c.c_type) + " beta=" + std::to_string(c.beta) + " k2=" + std::to_string(c.k2) +
         (c.nested ? " nested" : " plain") + (c.own_books ? " own books" : "") + " tile_n=" + std::to_string(c.tile_n);
}

template <class TC>
void check(const Case& c) {
  const std::string what = describe(c);
  const int64_t experts = int64_t(c.offsets.size()) - 1, rows = c.offsets.back();
  const Nf4Experts w(experts, c.out, c.in, c.nested, 40, c.own_books);
  const int64_t k = c.forward ? c.in : c.out, m = c.forward ? c.out : c.in;
  const std::vector<bf16> a = random_vec<bf16>(size_t(std::max<int64_t>(rows * k, 1)), 7);
  const std::vector<bf16> a2 = random_vec<bf16>(size_t(std::max<int64_t>(rows * c.k2, 1)), 8);
  const std::vector<bf16> b2 = random_vec<bf16>(size_t(std::max<int64_t>(experts * m * c.k2, 1)), 9);
  const std::vector<TC> c0 = random_vec<TC>(size_t(std::max<int64_t>(rows * m, 1)), 10);
  DeviceBuffer<bf16> a_d(a), a2_d(a2), b2_d(b2), dense_d(w.dense);
  DeviceBuffer<TC> want_d(c0), got_d(c0);
  const GemmType ct = std::is_same_v<TC, float> ? GemmType::kF32 : GemmType::kBF16;

  auto row = [&](void* out, const void* b) {
    RowGroupedGemm g;
    g.a = a_d.get(), g.lda = k, g.b = b, g.c = out, g.k = k, g.m = m, g.trans_b = c.forward;
    g.ab_type = GemmType::kBF16, g.c_type = ct, g.beta = c.beta;
    return g;
  };
  auto row2 = [&](void* out) {
    RowGroupedGemm g;  // A2 [N, k2], B2 [E, m, k2] (forward) or [E, k2, m]
    g.a = a2_d.get(), g.lda = c.k2, g.b = b2_d.get(), g.c = out, g.k = c.k2, g.m = m, g.trans_b = c.forward;
    g.ab_type = GemmType::kBF16, g.c_type = ct, g.beta = c.beta;
    return g;
  };
  auto list = [&](void* out, const void* b) { return row_grouped_problems(row(out, b), c.offsets); };
  auto second = [&](void* out) { return row_grouped_problems(row2(out), c.offsets); };
  // The experts with rows, as row_grouped_problems lists them.
  std::vector<Nf4Operand> weights;
  for (int64_t e = 0; e < experts; ++e)
    if (c.offsets[size_t(e) + 1] > c.offsets[size_t(e)]) weights.push_back(w.weights[size_t(e)]);

  DeviceBuffer<void*> slots(std::max<size_t>(cuda::grouped_gemm_pointer_slots(size_t(experts)), 1));
  const std::vector<GemmArgs> ref = list(want_d.get(), dense_d.get()), nf4 = list(got_d.get(), nullptr);
  ASSERT_EQ(sm90_nf4_unsupported(nf4, weights), nullptr) << what;
  const std::vector<GemmArgs> ref2 = second(want_d.get()), nf42 = second(got_d.get());
  cuda::sm90_grouped_gemm(ref, 0, slots.get(), nullptr, c.k2 > 0 ? &ref2 : nullptr, c.tile_n);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  cuda::sm90_grouped_gemm_nf4(nf4, weights, 0, slots.get(), nullptr, c.k2 > 0 ? &nf42 : nullptr, c.tile_n);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  const std::vector<TC> want = want_d.to_host(), got = got_d.to_host();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&want[i], &got[i], sizeof(TC)) != 0) {
      if (bad++ == 0) first = int64_t(i);
    }
  EXPECT_EQ(bad, 0) << what << ": first differing element " << first << " of " << want.size();

  // The TMA-fed kernel (kernels/grouped_gemm_tma.h; 256-wide tiles) with NF4 experts against itself on
  // the dequantised weights: its producer warpgroup writes the same values into the tiles TMA fills.
  if (c.tile_n != 256) return;
  DeviceBuffer<TC> tma_want_d(c0), tma_got_d(c0);
  const RowGroupedGemm tw = row(tma_want_d.get(), dense_d.get()), tg = row(tma_got_d.get(), nullptr);
  const RowGroupedGemm tw2 = row2(tma_want_d.get()), tg2 = row2(tma_got_d.get());
  ASSERT_EQ(sm90_tma_nf4_unsupported(tg, w.weights, c.k2 > 0 ? &tg2 : nullptr, c.offsets), nullptr) << what;
  cuda::sm90_grouped_gemm_tma(tw, c.k2 > 0 ? &tw2 : nullptr, c.offsets, 1, 0, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what << " (TMA, dequantised)";
  cuda::sm90_grouped_gemm_tma_nf4(tg, w.weights, c.k2 > 0 ? &tg2 : nullptr, c.offsets, 0, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what << " (TMA, NF4)";
  const std::vector<TC> tma_want = tma_want_d.to_host(), tma_got = tma_got_d.to_host();
  bad = 0, first = -1;
  for (size_t i = 0; i < tma_want.size(); ++i)
    if (std::memcmp(&tma_want[i], &tma_got[i], sizeof(TC)) != 0) {
      if (bad++ == 0) first = int64_t(i);
    }
  EXPECT_EQ(bad, 0) << what << " (TMA): first differing element " << first << " of " << tma_want.size();
}

class GroupedGemmNf4Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    LOOM_REQUIRE_GPU();
    if (!cuda::sm90_grouped_gemm_ready()) GTEST_SKIP() << "the sm90 kernel needs an sm_90 GPU and an sm_90a build";
  }
  static void run(const Case& c) {
    if (c.c_type == GemmType::kF32) check<float>(c);
    else check<bf16>(c);
  }
};

// Small uneven experts (0, 1, 7, 0, 13, 129, 200 and 64 rows), W [200, 192]: every tile of W's
// rows or columns ends mid-tile; each direction, output type, beta and tile width, both states.
TEST_F(GroupedGemmNf4Cuda, MatchesDequantisedProducts) {
  const std::vector<int64_t> off = {0, 0, 1, 8, 8, 21, 150, 350, 414};
  for (bool forward : {true, false})
    for (GemmType ct : {GemmType::kBF16, GemmType::kF32})
      for (float beta : {0.f, 1.f})
        for (int tile_n : {128, 256})
          for (bool nested : {true, false}) run({forward, off, 200, 192, ct, beta, 0, nested, tile_n});
  // Double-quantised weights each with a nested code book of its own.
  for (bool forward : {true, false})
    for (int tile_n : {128, 256}) run({forward, off, 200, 192, GemmType::kBF16, 0.f, 0, true, tile_n, true});
}

// A LoRA term in the same launch (its depth 16: a quarter of a k-step), forward and input gradient.
TEST_F(GroupedGemmNf4Cuda, WithALoraTerm) {
  const std::vector<int64_t> off = {0, 0, 1, 8, 8, 21, 150, 350, 414};
  for (bool forward : {true, false})
    for (int tile_n : {128, 256}) run({forward, off, 200, 192, GemmType::kBF16, 0.f, 16, true, tile_n});
}

// Qwen3-30B-A3B's gate_up (in 2048, out 1536) and down (in 768, out 2048) weights, 16 experts of
// 0-500 rows (the host quantises every expert: 128 of them would take minutes): forward and input
// gradient.
TEST_F(GroupedGemmNf4Cuda, Qwen3Shapes) {
  std::vector<int64_t> off{0};
  for (int e = 0; e < 16; ++e) off.push_back(off.back() + (e % 9 == 4 ? 0 : 64 + (e * 137) % 437));
  for (bool forward : {true, false}) {
    run({forward, off, 1536, 2048, GemmType::kBF16, 0.f, 16, true, 256});
    run({forward, off, 2048, 768, GemmType::kBF16, 0.f, 0, true, 256});
  }
}

}  // namespace
}  // namespace loom::test
