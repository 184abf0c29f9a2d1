// The CPU reference of kernels/lora_dy.h against the products written out in f64.
#include "tests/kernels/lora_dy_case.h"

namespace loom::test {
namespace {

// dt = sum_p dy b_p and db = alpha sum_p dy^T t_p in f64 from the same bf16 inputs.
void check(const LoraDyCase& c, uint32_t seed) {
  const int64_t ld_dy = c.ld_dy(), ld_b = c.ld_b(), ld_t = c.ld_t();
  const LoraDyInputs in = lora_dy_inputs(c, seed);
  const std::vector<bf16>&dy = in.dy, &b = in.b, &t = in.t;
  const float alpha = 0.625f;
  const auto [dt, db] = lora_dy_cpu(c, in, alpha);
  std::vector<double> ref_dt(c.n * c.r, 0.0), ref_db(c.out * c.r, 0.0);
  for (int64_t i = 0; i < c.n; ++i)
    for (int64_t o = 0; o < c.out; ++o) {
      const double g = bf16_to_float(dy[i * ld_dy + o]);
      for (int64_t j = 0; j < c.r; ++j)
        for (int p = 0; p < c.m; ++p) {
          ref_dt[i * c.r + j] += g * bf16_to_float(b[o * ld_b + p * c.r + j]);
          ref_db[o * c.r + j] += alpha * g * bf16_to_float(t[i * ld_t + p * c.r + j]);
        }
    }
  EXPECT_LT(rel_error(dt, ref_dt), ref_tol<float>()) << c.name();
  EXPECT_LT(rel_error(db, ref_db), ref_tol<float>()) << c.name();
}

TEST(LoraDyProducts, MatchF64Products) {
  check({37, 70, 3, 2, 0, 0, 0}, 1);
  check({129, 64, 16, 2, 0, 32, 0}, 2);  // B's parts as the backward keeps them: two of four blocks ([out, 4r])
  check({129, 64, 16, 2, 0, 16, 0}, 5);  // and at a pitch of 3r
  check({5, 200, 8, 1, 24, 0, 8}, 3);
  check({300, 130, 4, 3, 2, 1, 5}, 4);
}

TEST(LoraDyProducts, EmptyShapesGiveZeros) {
  const std::vector<bf16> none;
  const auto t = random_vec<bf16>(6 * 4, 5), b = random_vec<bf16>(3 * 4, 6);
  std::vector<float> dt(6 * 2, 7.f), db(3 * 2, 7.f);
  cpu::lora_dy_products(none.data(), 0, b.data(), 4, t.data(), 4, 6, 0, 2, 2, 1.f, dt.data(), nullptr);
  for (float v : dt) EXPECT_EQ(v, 0.f);
  cpu::lora_dy_products(none.data(), 3, b.data(), 4, t.data(), 4, 0, 3, 2, 2, 1.f, nullptr, db.data());
  for (float v : db) EXPECT_EQ(v, 0.f);
}

}  // namespace
}  // namespace loom::test
