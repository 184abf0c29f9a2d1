// The grouped products of mixture-of-experts layers (ops::grouped_matmul_into, row-grouped, and
// ops::grouped_matmul_tn_into, reduction-grouped) on the CPU, against the same products written out
// per expert as loops in f64 and against ops::matmul_into per expert: f64, f32 and bf16 inputs,
// experts without rows (first, middle, last), alpha and beta, a column slice as input, misuse.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/ops.h"

namespace loom::test {
namespace {

constexpr int64_t kE = 6, kN = 12, kK = 5, kM = 4;
// Experts 0, 2 and 5 have no rows; the others 3, 4 and 5.
const std::vector<int64_t> kOffsets = {0, 0, 3, 3, 7, 12, 12};

Tensor random(const Shape& s, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(-1, 1);
  std::vector<double> v(numel_of(s));
  for (auto& x : v) x = d(gen);
  return Tensor::from_doubles(v, s);
}
Tensor nans(const Shape& s) { return Tensor::from_doubles(std::vector<double>(numel_of(s), NAN), s); }
std::vector<double> doubles(const Tensor& t) { return t.contiguous().to(DType::f64).to_doubles(); }

// c[rows_e] = alpha * a[rows_e] op(b[e]) + beta * c0[rows_e], element by element (beta 0: c0 unread).
std::vector<double> row_grouped(const Tensor& a, const Tensor& b, const Tensor& c0, const std::vector<int64_t>& off,
                                bool tb, double alpha, double beta) {
  const auto x = doubles(a), w = doubles(b), c = doubles(c0);
  const int64_t k = a.size(1), m = c0.size(1);
  std::vector<double> out(c.size());
  for (size_t e = 0; e + 1 < off.size(); ++e)
    for (int64_t i = off[e]; i < off[e + 1]; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += x[i * k + p] * w[e * k * m + (tb ? j * k + p : p * m + j)];
        out[i * m + j] = alpha * s + (beta == 0 ? 0 : beta * c[i * m + j]);
      }
  return out;
}

// c[e] = alpha * a[rows_e]^T b[rows_e] + beta * c0[e] (an expert without rows: beta * c0[e]).
std::vector<double> reduction_grouped(const Tensor& a, const Tensor& b, const Tensor& c0,
                                      const std::vector<int64_t>& off, double alpha, double beta) {
  const auto x = doubles(a), y = doubles(b), c = doubles(c0);
  const int64_t m = a.size(1), k = b.size(1);
  std::vector<double> out(c.size());
  for (size_t e = 0; e + 1 < off.size(); ++e)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < k; ++j) {
        double s = 0;
        for (int64_t r = off[e]; r < off[e + 1]; ++r) s += x[r * m + i] * y[r * k + j];
        const size_t at = (e * m + i) * k + j;
        out[at] = alpha * s + (beta == 0 ? 0 : beta * c[at]);
      }
  return out;
}

// |got - want| <= tol * max(1, |want|) element by element.
void expect_near(const Tensor& got, const std::vector<double>& want, double tol, const std::string& what) {
  const auto g = doubles(got);
  ASSERT_EQ(g.size(), want.size()) << what;
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << what << " element " << i;
}

struct Types {
  DType in, out;
  double tol;  // f64: rounding only; f32: f32 accumulation over 12 terms; bf16 out: one bf16 rounding (2^-9)
};
const Types kTypes[] = {{DType::f64, DType::f64, 1e-12},
                        {DType::f32, DType::f32, 1e-5},
                        {DType::bf16, DType::f32, 1e-5},
                        {DType::bf16, DType::bf16, 4e-3}};

TEST(GroupedMatmul, RowGroupedIsThePerExpertLoop) {
  for (const Types& t : kTypes)
    for (bool tb : {false, true})
      for (auto [alpha, beta] : {std::pair{1.f, 0.f}, std::pair{2.f, 0.5f}, std::pair{-1.f, 1.f}}) {
        const Tensor a = random({kN, kK}, 1).to(t.in);
        const Tensor b = random(tb ? Shape{kE, kM, kK} : Shape{kE, kK, kM}, 2).to(t.in);
        // beta 0 never reads c: NaNs there must not come through.
        Tensor c = (beta == 0.f ? nans({kN, kM}) : random({kN, kM}, 3)).to(t.out);
        const Tensor c0 = c.clone();
        ops::grouped_matmul_into(a, b, c, kOffsets, tb, alpha, beta);
        expect_near(c, row_grouped(a, b, c0, kOffsets, tb, alpha, beta), t.tol,
                    std::string(name(t.in)) + "->" + std::string(name(t.out)) + (tb ? " trans_b" : "") +
                        " beta " + std::to_string(beta));
      }
}

// Two products into one output (a LoRA term folded into its base product): the sum of both
// per-expert loops, alpha over the sum, beta once; a second depth of its own (3 against 5); one of
// the two empty falls back to the other alone.
TEST(GroupedMatmul, DualIsTheSumOfBothPerExpertLoops) {
  constexpr int64_t kK2 = 3;
  for (const Types& t : kTypes)
    for (bool tb : {false, true})
      for (auto [alpha, beta] : {std::pair{1.f, 0.f}, std::pair{2.f, 0.5f}}) {
        const Tensor a = random({kN, kK}, 1).to(t.in), a2 = random({kN, kK2}, 4).to(t.in);
        const Tensor b = random(tb ? Shape{kE, kM, kK} : Shape{kE, kK, kM}, 2).to(t.in);
        const Tensor b2 = random(tb ? Shape{kE, kM, kK2} : Shape{kE, kK2, kM}, 5).to(t.in);
        Tensor c = (beta == 0.f ? nans({kN, kM}) : random({kN, kM}, 3)).to(t.out);
        const Tensor c0 = c.clone();
        ops::grouped_matmul_dual_into(a, b, a2, b2, c, kOffsets, tb, alpha, beta);
        const std::vector<double> first = row_grouped(a, b, c0, kOffsets, tb, alpha, beta);
        const std::vector<double> second = row_grouped(a2, b2, c0, kOffsets, tb, alpha, 0.0);
        const std::vector<double> got = doubles(c);
        // The CPU rounds the first product to the output's dtype before adding the second: each
        // rounding errs by at most tol relative to its own value (one of `first`, one of the sum).
        for (size_t i = 0; i < got.size(); ++i) {
          const double want = first[i] + second[i];
          const double bound = t.tol * (std::max(1.0, std::abs(first[i])) + std::max(1.0, std::abs(want)));
          ASSERT_NEAR(got[i], want, bound) << "dual " << name(t.in) << "->" << name(t.out) << (tb ? " trans_b" : "")
                                           << " beta " << beta << " element " << i;
        }
      }
  // An empty second product (K2 = 0) is the first alone.
  const Tensor a = random({kN, kK}, 1), b = random({kE, kM, kK}, 2);
  Tensor c = nans({kN, kM});
  ops::grouped_matmul_dual_into(a, b, Tensor::zeros({kN, 0}, DType::f64), Tensor::zeros({kE, kM, 0}, DType::f64), c,
                                kOffsets, true);
  expect_near(c, row_grouped(a, b, nans({kN, kM}), kOffsets, true, 1, 0), 1e-12, "dual with K2 = 0");
  // Misfits name the operands.
  Tensor out = Tensor::zeros({kN, kM}, DType::f64);
  EXPECT_THROW(ops::grouped_matmul_dual_into(a, b, random({kN, 3}, 4), random({kE, kM + 1, 3}, 5), out, kOffsets, true),
               Error);
  EXPECT_THROW(ops::grouped_matmul_dual_into(a, b, random({kN - 1, 3}, 4), random({kE, kM, 3}, 5), out, kOffsets, true),
               Error);
}

TEST(GroupedMatmul, ReductionGroupedIsThePerExpertLoop) {
  for (const Types& t : kTypes)
    for (auto [alpha, beta] : {std::pair{1.f, 0.f}, std::pair{2.f, 0.5f}, std::pair{-1.f, 1.f}}) {
      const Tensor a = random({kN, kM}, 4).to(t.in), b = random({kN, kK}, 5).to(t.in);
      Tensor c = (beta == 0.f ? nans({kE, kM, kK}) : random({kE, kM, kK}, 6)).to(t.out);
      const Tensor c0 = c.clone();
      ops::grouped_matmul_tn_into(a, b, c, kOffsets, alpha, beta);
      expect_near(c, reduction_grouped(a, b, c0, kOffsets, alpha, beta), t.tol,
                  std::string(name(t.in)) + "->" + std::string(name(t.out)) + " beta " + std::to_string(beta));
    }
}

// The same products as ops::matmul_into on each expert's views, in f32.
TEST(GroupedMatmul, EqualsMatmulIntoPerExpert) {
  const Tensor x = random({kN, kK}, 7).to(DType::f32), w = random({kE, kM, kK}, 8).to(DType::f32);
  const Tensor dy = random({kN, kM}, 9).to(DType::f32);
  Tensor y = Tensor::empty({kN, kM}, DType::f32), dw = Tensor::empty({kE, kM, kK}, DType::f32);
  ops::grouped_matmul_into(x, w, y, kOffsets, true);
  ops::grouped_matmul_tn_into(dy, x, dw, kOffsets);
  Tensor y_ref = Tensor::zeros({kN, kM}, DType::f32), dw_ref = Tensor::zeros({kE, kM, kK}, DType::f32);
  for (int64_t e = 0; e < kE; ++e) {
    const int64_t n = kOffsets[e + 1] - kOffsets[e];
    if (n == 0) continue;
    Tensor ye = y_ref.narrow(0, kOffsets[e], n), dwe = dw_ref.select(0, e);
    ops::matmul_into(x.narrow(0, kOffsets[e], n), w.select(0, e), ye, false, true);
    ops::matmul_into(dy.narrow(0, kOffsets[e], n), x.narrow(0, kOffsets[e], n), dwe, true, false);
  }
  expect_near(y, doubles(y_ref), 1e-6, "y");
  expect_near(dw, doubles(dw_ref), 1e-6, "dw");
}

// Inputs whose rows are column slices of wider matrices go in with their row stride.
TEST(GroupedMatmul, ColumnSlicesGoInWithTheirRowStride) {
  const Tensor a = random({kN, kK + 3}, 10).narrow(1, 2, kK), b = random({kE, kM, kK}, 11);
  const Tensor dy = random({kN, kM + 2}, 12).narrow(1, 1, kM);
  ASSERT_FALSE(a.is_contiguous());
  Tensor y = Tensor::empty({kN, kM}, DType::f64), dw = Tensor::empty({kE, kM, kK}, DType::f64);
  ops::grouped_matmul_into(a, b, y, kOffsets, true);
  ops::grouped_matmul_tn_into(dy, a, dw, kOffsets);
  expect_near(y, row_grouped(a, b, y, kOffsets, true, 1, 0), 1e-12, "y");
  expect_near(dw, reduction_grouped(dy, a, dw, kOffsets, 1, 0), 1e-12, "dw");
}

// No rows at all: the row-grouped product has nothing to write, every expert's c[e] is beta * c[e].
TEST(GroupedMatmul, NoRowsAtAll) {
  const std::vector<int64_t> none = {0, 0, 0};
  Tensor y = random({0, kM}, 13);
  ops::grouped_matmul_into(random({0, kK}, 14), random({2, kM, kK}, 15), y, none, true);
  Tensor c = random({2, kM, kK}, 16);
  const std::vector<double> c0 = doubles(c);
  ops::grouped_matmul_tn_into(random({0, kM}, 17), random({0, kK}, 18), c, none, 1.f, 0.5f);
  std::vector<double> want = c0;
  for (double& v : want) v *= 0.5;
  expect_near(c, want, 1e-15, "beta 0.5");
  ops::grouped_matmul_tn_into(random({0, kM}, 17), random({0, kK}, 18), c, none);
  expect_near(c, std::vector<double>(want.size(), 0.0), 0, "beta 0");
}

TEST(GroupedMatmul, MisuseIsAnError) {
  const Tensor a = random({kN, kK}, 19), w = random({kE, kM, kK}, 20), dy = random({kN, kM}, 21);
  Tensor y = Tensor::empty({kN, kM}, DType::f64), dw = Tensor::empty({kE, kM, kK}, DType::f64);
  EXPECT_THROW(ops::grouped_matmul_into(a, w, y, {0, 3, 7, 12}, true), Error);              // E + 1 offsets
  EXPECT_THROW(ops::grouped_matmul_into(a, w, y, {0, 0, 3, 3, 7, 11, 11}, true), Error);    // not ending at N
  EXPECT_THROW(ops::grouped_matmul_into(a, w, y, {0, 0, 5, 3, 7, 12, 12}, true), Error);    // decreasing
  EXPECT_THROW(ops::grouped_matmul_into(a, w, y, kOffsets, false), Error);                  // [K, M] is not [4, 5]
  EXPECT_THROW(ops::grouped_matmul_into(a.to(DType::f32), w, y, kOffsets, true), Error);    // dtypes differ
  Tensor y_bf16 = Tensor::empty({kN, kM}, DType::bf16);
  EXPECT_THROW(ops::grouped_matmul_into(a.to(DType::f32), w.to(DType::f32), y_bf16, kOffsets, true), Error);
  EXPECT_THROW(ops::grouped_matmul_tn_into(dy, a, dw, {0, 12}), Error);                     // one expert, six outputs
  Tensor dw_t = Tensor::empty({kE, kK, kM}, DType::f64);
  EXPECT_THROW(ops::grouped_matmul_tn_into(dy, a, dw_t, kOffsets), Error);                  // [E, K, M]
  Tensor strided = Tensor::empty({kN, kM + 1}, DType::f64).narrow(1, 0, kM);
  EXPECT_THROW(ops::grouped_matmul_into(a, w, strided, kOffsets, true), Error);             // output not contiguous
  Tensor shared = random({2 * kN, kM}, 22);
  Tensor out = shared.narrow(0, 0, kN);  // contiguous, but the input's storage
  EXPECT_THROW(ops::grouped_matmul_into(shared.narrow(0, kN, kN), random({kE, kM, kM}, 23), out, kOffsets, true),
               Error);
}

}  // namespace
}  // namespace loom::test
