// Finite-difference gradient check in f64 on the CPU: compares backward() against central
// differences of L(x) = sum(r * f(x)) for a random r, element by element; and the comparison
// helpers the autograd tests share.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "autograd/functions.h"

namespace loom::test {

inline Tensor random_f64(const Shape& shape, uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(numel_of(shape));
  for (auto& x : v) x = d(gen);
  return Tensor::from_doubles(v, shape);
}

// Relative L2 error of a against b, both read as f64.
inline double rel_err(const Tensor& a, const Tensor& b) {
  const auto x = a.to(DType::f64).to_doubles(), y = b.to(DType::f64).to_doubles();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) num += (x[i] - y[i]) * (x[i] - y[i]), den += y[i] * y[i];
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

// Random f64 values in [-scale, scale) rounded to bf16 once, so that a bf16 path and an f64 one
// start from identical values.
inline Tensor bf16_values(const Shape& s, uint32_t seed, double scale) {
  return ops::scale(random_f64(s, seed), float(scale)).to(DType::bf16).to(DType::f64);
}

using Fn = std::function<ag::Variable(const std::vector<ag::Variable>&)>;

// Central differences with step h have truncation error O(h^2 f''') ~ 1e-12 and rounding error
// ~ 1e-16 / h ~ 1e-10 in f64; a tolerance of 1e-6 (relative to max(1, |g|)) leaves ample margin
// while still failing on any real formula mistake (those are O(1) relative).
inline void gradcheck(const Fn& f, const std::vector<Tensor>& inputs, const std::vector<bool>& wrt = {},
                      double h = 1e-6, double tol = 1e-6) {
  std::vector<ag::Variable> vars;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool g = (wrt.empty() || wrt[i]) && is_float(inputs[i].dtype());
    vars.emplace_back(inputs[i].clone(), g);
  }
  ag::Variable out = f(vars);
  ASSERT_TRUE(out.requires_grad());
  Tensor r = random_f64(out.shape(), 1234);
  const std::vector<double> rv = r.to_doubles();
  ag::backward(out, r);
  ASSERT_EQ(ag::tape_size(), 0u) << "backward must consume the tape";

  auto loss = [&](const std::vector<Tensor>& xs) {
    ag::NoGradGuard ng;
    std::vector<ag::Variable> vs;
    for (const auto& x : xs) vs.emplace_back(x, false);
    std::vector<double> y = f(vs).value().to_doubles();
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += rv[i] * y[i];
    return s;
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!vars[i].requires_grad()) continue;
    ASSERT_TRUE(vars[i].grad().defined()) << "input " << i << " got no gradient";
    const std::vector<double> analytic = vars[i].grad().to_doubles();
    std::vector<double> base = inputs[i].to_doubles();
    double worst = 0;
    for (size_t j = 0; j < base.size(); ++j) {
      std::vector<Tensor> xs = inputs;
      std::vector<double> p = base;
      p[j] = base[j] + h;
      xs[i] = Tensor::from_doubles(p, inputs[i].shape());
      const double lp = loss(xs);
      p[j] = base[j] - h;
      xs[i] = Tensor::from_doubles(p, inputs[i].shape());
      const double lm = loss(xs);
      const double numeric = (lp - lm) / (2 * h);
      const double err = std::abs(numeric - analytic[j]) / std::max(1.0, std::abs(numeric));
      worst = std::max(worst, err);
      ASSERT_LT(err, tol) << "input " << i << " element " << j << ": numeric " << numeric << " analytic "
                          << analytic[j];
    }
  }
}

}  // namespace loom::test
