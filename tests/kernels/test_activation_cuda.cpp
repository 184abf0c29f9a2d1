// CUDA SwiGLU / GeGLU against the CPU reference, n from 1 to 2^20 + 3 (pack tails), with aligned
// pointers (16-byte packs) and pointers one element off (the scalar path).
#include "kernels/activation.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

template <class T>
class ActivationCuda : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(ActivationCuda, Types);

// offset = 1 shifts every device pointer by one element so the launcher falls back to scalars.
template <class T, class CpuFwd, class CpuBwd, class CudaFwd, class CudaBwd>
void check(CpuFwd cpu_fwd, CpuBwd cpu_bwd, CudaFwd cuda_fwd, CudaBwd cuda_bwd) {
  for (int64_t n : {1, 7, 8, 1001, 65539, (1 << 20) + 3}) {
    for (int64_t offset : {0, 1}) {
      auto g = random_vec<T>(n, 131 + n, -8.f, 8.f), u = random_vec<T>(n, 132 + n, -2.f, 2.f);
      auto d = random_vec<T>(n, 133 + n);
      std::vector<T> ref_out(n), ref_dg(n), ref_du(n);
      cpu_fwd(g.data(), u.data(), ref_out.data(), n);
      cpu_bwd(g.data(), u.data(), d.data(), ref_dg.data(), ref_du.data(), n, nullptr);
      auto pad = [&](const std::vector<T>& v) {
        std::vector<T> p(offset);
        for (auto& e : p) e = from_acc<T>(Acc<T>(0));
        p.insert(p.end(), v.begin(), v.end());
        return p;
      };
      DeviceBuffer<T> d_g(pad(g)), d_u(pad(u)), d_d(pad(d)), d_out(n + offset), d_dg(n + offset), d_du(n + offset);
      cuda_fwd(d_g.get() + offset, d_u.get() + offset, d_out.get() + offset, n, nullptr);
      cuda_bwd(d_g.get() + offset, d_u.get() + offset, d_d.get() + offset, d_dg.get() + offset, d_du.get() + offset, n,
               nullptr, nullptr);
      auto strip = [&](const std::vector<T>& v) { return std::vector<T>(v.begin() + offset, v.end()); };
      // The backward's optional value: the forward kernel's output bit for bit, written over dout
      // (in place, as ops::glu_backward_with_value runs it), the gradients unchanged.
      DeviceBuffer<T> d_dg2(n + offset), d_du2(n + offset);
      cuda_bwd(d_g.get() + offset, d_u.get() + offset, d_d.get() + offset, d_dg2.get() + offset, d_du2.get() + offset,
               n, nullptr, d_d.get() + offset);
      EXPECT_EQ(to_f64(strip(d_d.to_host())), to_f64(strip(d_out.to_host()))) << "n=" << n << " offset=" << offset;
      EXPECT_EQ(to_f64(strip(d_dg2.to_host())), to_f64(strip(d_dg.to_host()))) << "n=" << n << " offset=" << offset;
      EXPECT_EQ(to_f64(strip(d_du2.to_host())), to_f64(strip(d_du.to_host()))) << "n=" << n << " offset=" << offset;
      // expf / tanhf against libm differ by a few ulp, and the GPU may fuse multiply-adds: f32
      // outputs agree to ~1e-6 (tol<float>() 1e-5); bf16 outputs differ by at most the occasional
      // one-ulp rounding flip (tol<bf16>()).
      EXPECT_LT(rel_error(strip(d_out.to_host()), ref_out), tol<T>()) << "n=" << n << " offset=" << offset;
      EXPECT_LT(rel_error(strip(d_dg.to_host()), ref_dg), tol<T>()) << "n=" << n << " offset=" << offset;
      EXPECT_LT(rel_error(strip(d_du.to_host()), ref_du), tol<T>()) << "n=" << n << " offset=" << offset;
    }
  }
}

TYPED_TEST(ActivationCuda, SwigluMatchesCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  check<T>(cpu::swiglu_forward<T>, cpu::swiglu_backward<T>, cuda::swiglu_forward<T>, cuda::swiglu_backward<T>);
}

TYPED_TEST(ActivationCuda, GegluMatchesCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  check<T>(cpu::geglu_forward<T>, cpu::geglu_backward<T>, cuda::geglu_forward<T>, cuda::geglu_backward<T>);
}

// Gates far in both tails: finite results and the right limits, as on the CPU.
TEST(ActivationCudaF32, SaturatedGatesStayFinite) {
  LOOM_REQUIRE_GPU();
  std::vector<float> g = {-1000.f, -100.f, 100.f, 1000.f}, ones(4, 1.f);
  DeviceBuffer<float> d_g(g), d_u(ones), d_d(ones), out(4), dg(4), du(4);
  cuda::swiglu_forward(d_g.get(), d_u.get(), out.get(), 4, nullptr);
  cuda::swiglu_backward(d_g.get(), d_u.get(), d_d.get(), dg.get(), du.get(), 4, nullptr);
  auto o = out.to_host(), dgh = dg.to_host();
  EXPECT_EQ(o[0], 0.f);
  EXPECT_EQ(o[3], 1000.f);
  EXPECT_EQ(dgh[0], 0.f);
  EXPECT_EQ(dgh[3], 1.f);
  cuda::geglu_forward(d_g.get(), d_u.get(), out.get(), 4, nullptr);
  cuda::geglu_backward(d_g.get(), d_u.get(), d_d.get(), dg.get(), du.get(), 4, nullptr);
  o = out.to_host();
  dgh = dg.to_host();
  auto duh = du.to_host();
  EXPECT_EQ(o[0], 0.f);
  EXPECT_EQ(o[3], 1000.f);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isfinite(dgh[i]) && std::isfinite(duh[i])) << i;
}

}  // namespace
}  // namespace loom::test
