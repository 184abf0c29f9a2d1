// CUDA elementwise kernels and reductions against the CPU reference, odd sizes included.
#include "kernels/elementwise.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

template <class T>
class ElementwiseCuda : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(ElementwiseCuda, Types);

TYPED_TEST(ElementwiseCuda, AxpbyMulScaleMatchCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  for (int64_t n : {1, 31, 1000, 65537}) {
    auto a = random_vec<T>(n, 1 + n), b = random_vec<T>(n, 2 + n);
    std::vector<T> ref(n);
    DeviceBuffer<T> da(a), db(b), out(n);
    cpu::axpby(a.data(), b.data(), ref.data(), n, 0.5f, -2.f);
    cuda::axpby(da.get(), db.get(), out.get(), n, 0.5f, -2.f, nullptr);
    EXPECT_LT(rel_error(out.to_host(), ref), tol<T>()) << "axpby n=" << n;
    cpu::mul(a.data(), b.data(), ref.data(), n);
    cuda::mul(da.get(), db.get(), out.get(), n, nullptr);
    EXPECT_LT(rel_error(out.to_host(), ref), tol<T>()) << "mul n=" << n;
    cpu::scale(a.data(), ref.data(), n, 3.f);
    cuda::scale(da.get(), out.get(), n, 3.f, nullptr);
    EXPECT_LT(rel_error(out.to_host(), ref), tol<T>()) << "scale n=" << n;
  }
}

TYPED_TEST(ElementwiseCuda, BiasAndColumnSumsMatchCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  const int64_t rows = 37, cols = 129;
  auto a = random_vec<T>(rows * cols, 3), bias = random_vec<T>(cols, 4);
  std::vector<T> ref(rows * cols), ref_sum(cols);
  DeviceBuffer<T> da(a), dbias(bias), out(rows * cols), sums(cols);
  cpu::add_bias(a.data(), bias.data(), ref.data(), rows, cols);
  cuda::add_bias(da.get(), dbias.get(), out.get(), rows, cols, nullptr);
  EXPECT_LT(rel_error(out.to_host(), ref), tol<T>());
  cpu::sum_rows(a.data(), ref_sum.data(), rows, cols, false);
  cuda::sum_rows(da.get(), sums.get(), rows, cols, false, nullptr);
  EXPECT_LT(rel_error(sums.to_host(), ref_sum), tol<T>());
}

TYPED_TEST(ElementwiseCuda, StridedCopyTransposesAndCasts) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  const int64_t r = 33, c = 65;
  auto a = random_vec<T>(r * c, 5);
  StridedLayout l;  // the transpose of a [r, c] row-major matrix
  l.ndim = 2;
  l.shape[0] = c; l.shape[1] = r;
  l.strides[0] = 1; l.strides[1] = c;
  std::vector<float> ref(r * c);
  cpu::copy_strided(a.data(), l, ref.data());
  DeviceBuffer<T> da(a);
  DeviceBuffer<float> out(r * c);
  cuda::copy_strided(da.get(), l, out.get(), nullptr);
  EXPECT_EQ(rel_error(out.to_host(), ref), 0.0);  // a cast to f32 and a gather are exact
}

TYPED_TEST(ElementwiseCuda, ReductionsMatchCpuAndAreDeterministic) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  for (int64_t n : {1, 255, 100003, 3000001}) {
    auto a = random_vec<T>(n, 6 + n);
    float ref_sum, ref_sq;
    cpu::sum(a.data(), n, &ref_sum);
    cpu::sum_squares(a.data(), n, &ref_sq);
    DeviceBuffer<T> da(a);
    DeviceBuffer<float> out(2), ws(cuda::kReduceWorkspaceFloats);
    cuda::sum(da.get(), n, out.get(), ws.get(), nullptr);
    cuda::sum_squares(da.get(), n, out.get() + 1, ws.get(), nullptr);
    auto got = out.to_host();
    // f32 accumulation of n terms of magnitude <= 1: error bound ~ n * 2^-24 * sum|a|.
    EXPECT_NEAR(got[0], ref_sum, 1e-5 * n + 1e-6) << "n=" << n;
    EXPECT_NEAR(got[1], ref_sq, 1e-6 * std::abs(ref_sq) + 1e-6) << "n=" << n;
    cuda::sum(da.get(), n, out.get() + 1, ws.get(), nullptr);
    auto again = out.to_host();
    EXPECT_EQ(got[0], again[1]) << "reduction is not deterministic, n=" << n;
  }
}

}  // namespace
}  // namespace loom::test
