// CUDA RMSNorm against the CPU reference: forward (y, rstd), backward (dx, accumulated dw), odd and
// large widths (scalar and 16-byte paths, > 48 KiB of shared memory), determinism and dw = nullptr.
#include "kernels/norm.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

template <class T>
class RmsNormCuda : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(RmsNormCuda, Types);

// (rows, cols): odd widths take the scalar path, multiples of 8 the packed one; 1100 x 4096 and
// 300 x 16384 have more rows than backward blocks (grid-stride); 20000 columns need 80 KB of
// shared memory for dw (the opt-in attribute path).
const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 1},     {3, 7},      {17, 128},  {5, 1001},
                                                          {1100, 4096}, {300, 16384}, {3, 20000}};
// Backward leaves out cols = 1, where dx = r g dy eps / (x^2 + eps) is pure cancellation and any
// f32 rounding difference is a large relative error.
const std::vector<std::pair<int64_t, int64_t>> kBackwardShapes = {{1, 2},       {3, 7},       {17, 128}, {5, 1001},
                                                                  {1100, 4096}, {300, 16384}, {3, 20000}};

TYPED_TEST(RmsNormCuda, ForwardMatchesCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  for (auto [rows, cols] : kShapes) {
    for (bool add_one : {false, true}) {
      auto x = random_vec<T>(rows * cols, 101 + cols, -2.f, 2.f), w = random_vec<T>(cols, 102 + cols);
      std::vector<T> ref(rows * cols);
      std::vector<float> ref_rstd(rows);
      cpu::rms_norm_forward(x.data(), w.data(), ref.data(), ref_rstd.data(), rows, cols, 1e-6f, add_one);
      DeviceBuffer<T> dx(x), dw(w), dy(rows * cols);
      DeviceBuffer<float> drstd(rows);
      cuda::rms_norm_forward(dx.get(), dw.get(), dy.get(), drstd.get(), rows, cols, 1e-6f, add_one, nullptr);
      // y: see tol<T>(); rstd: f32 row sums in another order, ~sqrt(cols) * 2^-24 relative.
      EXPECT_LT(rel_error(dy.to_host(), ref), tol<T>()) << rows << "x" << cols << " add_one=" << add_one;
      EXPECT_LT(rel_error(drstd.to_host(), ref_rstd), 1e-5) << rows << "x" << cols;
    }
  }
}

TYPED_TEST(RmsNormCuda, BackwardMatchesCpuAndIsDeterministic) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  for (auto [rows, cols] : kBackwardShapes) {
    for (bool add_one : {false, true}) {
      auto x = random_vec<T>(rows * cols, 111 + cols, -2.f, 2.f), w = random_vec<T>(cols, 112 + cols);
      auto g = random_vec<T>(rows * cols, 113 + cols);
      auto dw0 = random_vec<float>(cols, 114 + cols);  // dw accumulates into existing values
      std::vector<T> y(rows * cols), ref_dx(rows * cols);
      std::vector<float> rstd(rows), ref_dw = dw0;
      cpu::rms_norm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, cols, 1e-6f, add_one);
      cpu::rms_norm_backward(x.data(), w.data(), rstd.data(), g.data(), ref_dx.data(), ref_dw.data(), rows, cols,
                             add_one);
      DeviceBuffer<T> d_x(x), d_w(w), d_g(g), d_dx(rows * cols), d_dx2(rows * cols);
      DeviceBuffer<float> d_rstd(rstd), d_dw(dw0), d_dw2(dw0);
      DeviceBuffer<unsigned char> ws(cuda::rms_norm_backward_workspace_bytes(rows, cols));
      cuda::rms_norm_backward(d_x.get(), d_w.get(), d_rstd.get(), d_g.get(), d_dx.get(), d_dw.get(), rows, cols,
                              add_one, ws.get(), nullptr);
      // dx: see tol<T>() (the row dot product is an f32 sum in another order). dw: f32 sums of
      // <= 1100 terms against the CPU's f64 sums, ~1e-6 relative.
      auto dx = d_dx.to_host();
      auto dw = d_dw.to_host();
      EXPECT_LT(rel_error(dx, ref_dx), tol<T>()) << rows << "x" << cols << " add_one=" << add_one;
      EXPECT_LT(rel_error(dw, ref_dw), 1e-5) << rows << "x" << cols << " add_one=" << add_one;
      // Same inputs, same bits; and a frozen weight (dw = nullptr, no workspace) gives the same dx.
      cuda::rms_norm_backward(d_x.get(), d_w.get(), d_rstd.get(), d_g.get(), d_dx2.get(), d_dw2.get(), rows, cols,
                              add_one, ws.get(), nullptr);
      auto dw2 = d_dw2.to_host();
      EXPECT_EQ(0, memcmp(dw.data(), dw2.data(), cols * sizeof(float))) << "dw not deterministic";
      cuda::rms_norm_backward(d_x.get(), d_w.get(), d_rstd.get(), d_g.get(), d_dx2.get(), static_cast<float*>(nullptr),
                              rows, cols, add_one, nullptr, nullptr);
      auto dx2 = d_dx2.to_host();
      EXPECT_EQ(0, memcmp(dx.data(), dx2.data(), dx.size() * sizeof(T))) << "dx differs without dw";
    }
  }
}

TEST(RmsNormCudaChecks, DwWithoutWorkspaceThrows) {
  LOOM_REQUIRE_GPU();
  DeviceBuffer<float> x(8), w(4), rstd(2), dy(8), dx(8), dw(4);
  EXPECT_THROW(cuda::rms_norm_backward(x.get(), w.get(), rstd.get(), dy.get(), dx.get(), dw.get(), 2, 4, false,
                                       nullptr, nullptr),
               Error);
}

}  // namespace
}  // namespace loom::test
