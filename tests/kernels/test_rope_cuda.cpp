// CUDA RoPE against the CPU reference: forward, backward and in place, head_dim from 2 to 256
// (frequency counts below, at and above one 128-thread row), positions up to 2^17.
#include "kernels/rope.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

template <class T>
class RopeCuda : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(RopeCuda, Types);

std::vector<int32_t> random_positions(int64_t tokens, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, 1 << 17);
  std::vector<int32_t> p(tokens);
  for (auto& v : p) v = dist(gen);
  return p;
}

TYPED_TEST(RopeCuda, ForwardBackwardInPlaceMatchCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  for (auto [tokens, heads, d] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 2}, {7, 3, 64}, {33, 5, 128},
                                  {100, 2, 80}, {9, 3, 256}, {1000, 8, 128}}) {
    auto x = random_vec<T>(tokens * heads * d, 121 + d + tokens), g = random_vec<T>(tokens * heads * d, 122 + d);
    auto pos = random_positions(tokens, 123 + tokens);
    pos[0] = 0;
    auto inv = cpu::rope_inv_freq(d, 500000.0);
    std::vector<T> ref_y(x.size()), ref_dx(x.size());
    cpu::rope_forward(x.data(), ref_y.data(), pos.data(), inv.data(), tokens, heads, d, d, 1.f);
    cpu::rope_backward(g.data(), ref_dx.data(), pos.data(), inv.data(), tokens, heads, d, d, 1.f);
    DeviceBuffer<T> d_x(x), d_g(g), d_y(x.size()), d_dx(x.size());
    DeviceBuffer<int32_t> d_pos(pos);
    DeviceBuffer<float> d_inv(inv);
    cuda::rope_forward(d_x.get(), d_y.get(), d_pos.get(), d_inv.get(), tokens, heads, d, d, 1.f, nullptr);
    cuda::rope_backward(d_g.get(), d_dx.get(), d_pos.get(), d_inv.get(), tokens, heads, d, d, 1.f, nullptr);
    // The angle is the same f32 product on both sides; sincosf and libm's cos/sin differ by ~1
    // ulp and the GPU may fuse a multiply-add, so f32 outputs agree to ~1e-7 (tol<float>() 1e-5);
    // bf16: one output rounding (tol<bf16>()).
    EXPECT_LT(rel_error(d_y.to_host(), ref_y), tol<T>()) << tokens << "x" << heads << "x" << d;
    EXPECT_LT(rel_error(d_dx.to_host(), ref_dx), tol<T>()) << tokens << "x" << heads << "x" << d;
    // In place: y over x, then dx over y.
    cuda::rope_forward(d_x.get(), d_x.get(), d_pos.get(), d_inv.get(), tokens, heads, d, d, 1.f, nullptr);
    EXPECT_LT(rel_error(d_x.to_host(), ref_y), tol<T>()) << "in place forward";
    cuda::rope_backward(d_g.get(), d_g.get(), d_pos.get(), d_inv.get(), tokens, heads, d, d, 1.f, nullptr);
    EXPECT_LT(rel_error(d_g.to_host(), ref_dx), tol<T>()) << "in place backward";
  }
}

}  // namespace
}  // namespace loom::test
