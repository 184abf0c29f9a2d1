// The CUDA kernel of kernels/lora_dy.h against its CPU reference: the same products in another
// summation order (f32 tolerance), over the shapes the LoRA backward gives it and the edges of its
// tiles (rows and columns past a 128 x 64 tile, ranks that leave the padded width part empty).
#include "tests/kernels/lora_dy_case.h"

namespace loom::test {
namespace {

void check(const LoraDyCase& c, uint32_t seed) {
  const int64_t ld_dy = c.ld_dy(), ld_b = c.ld_b(), ld_t = c.ld_t();
  const LoraDyInputs in = lora_dy_inputs(c, seed);
  const float alpha = 0.625f;
  const auto [ref_dt, ref_db] = lora_dy_cpu(c, in, alpha);
  DeviceBuffer<bf16> d_dy(in.dy), d_b(in.b), d_t(in.t);
  ASSERT_TRUE(cuda::lora_dy_products_supported(d_dy.get(), ld_dy, d_b.get(), ld_b, d_t.get(), ld_t, c.out, c.r, c.m));
  DeviceBuffer<float> d_dt(std::vector<float>(c.n * c.r, NAN)), d_db(std::vector<float>(c.out * c.r, NAN)),
      work(cuda::lora_dy_products_workspace(c.n, c.out, c.r, c.m));
  cuda::lora_dy_products(d_dy.get(), ld_dy, d_b.get(), ld_b, d_t.get(), ld_t, c.n, c.out, c.r, c.m, alpha, d_dt.get(),
                         d_db.get(), work.get(), nullptr);
  const std::string what = c.name();
  EXPECT_LT(rel_error(d_dt.to_host(), ref_dt), tol<float>()) << what;
  EXPECT_LT(rel_error(d_db.to_host(), ref_db), tol<float>()) << what;
}

TEST(LoraDyProductsCuda, MatchesCpu) {
  LOOM_REQUIRE_GPU();
  check({300, 72, 4, 2, 8, 0, 0}, 1);       // m r = 8: half of the 16-wide tile empty; 2 row chunks + a part
  check({1000, 520, 16, 2, 0, 16, 0}, 2);   // B's parts at a pitch of 3r (the backward's is 4r now)
  check({129, 2048, 16, 2, 0, 16, 0}, 3);   // one row past a chunk, several column strips
  check({4096, 8192, 16, 2, 0, 16, 0}, 4);  // gate/up of a 1B layer (fewer rows)
  check({640, 1024, 32, 2, 0, 32, 0}, 5);   // 64 wide
  check({384, 256, 64, 2, 0, 64, 0}, 6);    // 128 wide (three t buffers)
  check({200, 96, 8, 1, 0, 0, 0}, 7);       // one block of r
  check({1024, 14336, 16, 2, 0, 16, 0}, 8);  // 8B gate/up's columns (28 strips of 512)
  check({520, 1000, 8, 2, 0, 8, 0}, 9);     // 16 wide: one strip of 16 chunks, partly past dy
}

TEST(LoraDyProductsCuda, Refuses) {
  LOOM_REQUIRE_GPU();
  DeviceBuffer<bf16> x(std::vector<bf16>(1024));
  EXPECT_FALSE(cuda::lora_dy_products_supported(x.get(), 64, x.get(), 12, x.get(), 8, 64, 4, 2));   // b's pitch
  EXPECT_FALSE(cuda::lora_dy_products_supported(x.get(), 64, x.get(), 8, x.get(), 8, 60, 4, 2));    // out % 8
  EXPECT_FALSE(cuda::lora_dy_products_supported(x.get(), 64, x.get(), 136, x.get(), 136, 64, 68, 2));  // m r > 128
  EXPECT_FALSE(cuda::lora_dy_products_supported(x.get() + 1, 64, x.get(), 8, x.get(), 8, 64, 4, 2));  // dy's start
}

}  // namespace
}  // namespace loom::test
