// One case of kernels/lora_dy.h's products for its CPU and CUDA tests: the shape, the spare columns
// after each operand's rows, and seeded bf16 operands (dy in [-1, 1), B's parts small as a trained
// B's are, t's parts in [-2, 2)).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/lora_dy.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {

struct LoraDyCase {
  int64_t n, out, r;
  int m;
  int64_t pad_dy, pad_b, pad_t;  // spare columns after each row
  int64_t mr() const { return m * r; }
  int64_t ld_dy() const { return out + pad_dy; }
  int64_t ld_b() const { return mr() + pad_b; }
  int64_t ld_t() const { return mr() + pad_t; }
  std::string name() const {
    return std::to_string(n) + "x" + std::to_string(out) + " r" + std::to_string(r) + " m" + std::to_string(m);
  }
};

struct LoraDyInputs {
  std::vector<bf16> dy, b, t;
};
inline LoraDyInputs lora_dy_inputs(const LoraDyCase& c, uint32_t seed) {
  return {random_vec<bf16>(c.n * c.ld_dy(), seed), random_vec<bf16>(c.out * c.ld_b(), seed + 1, -0.1f, 0.1f),
          random_vec<bf16>(c.n * c.ld_t(), seed + 2, -2.f, 2.f)};
}

// The CPU reference's dt [n, r] and db [out, r] of those operands.
struct LoraDyOutputs {
  std::vector<float> dt, db;
};
inline LoraDyOutputs lora_dy_cpu(const LoraDyCase& c, const LoraDyInputs& in, float alpha) {
  LoraDyOutputs o{std::vector<float>(c.n * c.r), std::vector<float>(c.out * c.r)};
  cpu::lora_dy_products(in.dy.data(), c.ld_dy(), in.b.data(), c.ld_b(), in.t.data(), c.ld_t(), c.n, c.out, c.r, c.m,
                        alpha, o.dt.data(), o.db.data());
  return o;
}

}  // namespace loom::test
