// ops::matmul with operands that are column slices of wider matrices (rows contiguous, row stride
// larger than the width): they go to the GEMM as they are, with their row stride as the leading
// dimension (the LoRA path keeps B's [hi, lo] parts as a slice of [hi, hi, lo]). Against the
// products written out as loops in f64.
#include <gtest/gtest.h>

#include <random>

#include "engine/ops.h"

namespace loom::test {
namespace {

Tensor random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(-1, 1);
  std::vector<double> v(size_t(rows * cols));
  for (auto& x : v) x = d(gen);
  return Tensor::from_doubles(v, {rows, cols});
}

// a [m, k] (or [k, m] when trans_a) times b [k, n] (or [n, k] when trans_b), read element by element.
std::vector<double> product(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  const auto x = ac.to_doubles(), y = bc.to_doubles();
  const int64_t m = trans_a ? a.size(1) : a.size(0), k = trans_a ? a.size(0) : a.size(1);
  const int64_t n = trans_b ? b.size(0) : b.size(1);
  std::vector<double> c(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        c[size_t(i * n + j)] += x[size_t(trans_a ? p * m + i : i * k + p)] * y[size_t(trans_b ? j * k + p : p * n + j)];
  return c;
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "element " << i;
}

TEST(Matmul, ColumnSlicesGoInWithTheirRowStride) {
  const Tensor wide_a = random_matrix(5, 15, 1), wide_b = random_matrix(7, 12, 2), wide_bt = random_matrix(6, 20, 3);
  const Tensor a = wide_a.narrow(1, 2, 7);    // [5, 7], row stride 15
  const Tensor b = wide_b.narrow(1, 3, 6);    // [7, 6], row stride 12
  const Tensor bt = wide_bt.narrow(1, 4, 7);  // [6, 7], row stride 20
  ASSERT_FALSE(a.is_contiguous());
  expect_near(ops::matmul(a, b).to_doubles(), product(a, b, false, false));
  expect_near(ops::matmul(a, bt, false, true).to_doubles(), product(a, bt, false, true));
  const Tensor at = random_matrix(7, 9, 4).narrow(1, 1, 5);  // [7, 5], read transposed
  expect_near(ops::matmul(at, b, true, false).to_doubles(), product(at, b, true, false));
  // Accumulating into an output (beta = 1) through a slice as well.
  Tensor c = Tensor::from_doubles(std::vector<double>(30, 1.0), {5, 6});
  ops::matmul_into(a, b, c, false, false, 2.f, 1.f);
  std::vector<double> want = product(a, b, false, false);
  for (double& w : want) w = 2 * w + 1;
  expect_near(c.to_doubles(), want);
}

// An operand that shares memory with the output is refused (it would be read while written).
TEST(Matmul, AnOperandSharingTheOutputsMemoryIsRefused) {
  Tensor c = random_matrix(5, 6, 5);
  const Tensor b = random_matrix(5, 6, 6);
  EXPECT_THROW(ops::matmul_into(c.narrow(1, 0, 5), b, c, false, false, 1.f, 1.f), Error);
  EXPECT_THROW(ops::matmul_into(b.narrow(1, 0, 5), c, c, false, false), Error);
}

// C read apart from the output (c_in) into a row-pitched output (a view of a wider matrix's columns):
// out = alpha a b + beta c_in, c_in and the wider matrix's other columns untouched; an empty sum (k = 0)
// into such an output; and the refusals (C_in of other strides, C_in overlapping the output).
TEST(Matmul, ReadsCApartIntoARowPitchedOutput) {
  const Tensor a = random_matrix(5, 7, 11), b = random_matrix(7, 6, 12);
  Tensor wide_in = random_matrix(5, 9, 13), wide_out = Tensor::from_doubles(std::vector<double>(45, -7.0), {5, 9});
  const Tensor c_in = wide_in.narrow(1, 0, 6);
  Tensor out = wide_out.narrow(1, 0, 6);
  const std::vector<double> in_before = wide_in.to_doubles();
  ops::matmul_into(a, b, out, false, false, 2.f, 0.5f, &c_in);
  std::vector<double> want = product(a, b, false, false);
  const std::vector<double> cv = c_in.contiguous().to_doubles();
  for (size_t i = 0; i < want.size(); ++i) want[i] = 2 * want[i] + 0.5 * cv[i];
  expect_near(out.contiguous().to_doubles(), want);
  EXPECT_EQ(wide_in.to_doubles(), in_before) << "C_in was written";
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 6; j < 9; ++j) EXPECT_EQ(wide_out.to_doubles()[size_t(i * 9 + j)], -7.0) << "beyond the view";
  // k = 0: out = beta c_in, through the pitched rows.
  ops::matmul_into(Tensor::zeros({5, 0}, DType::f64), Tensor::zeros({0, 6}, DType::f64), out, false, false, 1.f, 2.f,
                   &c_in);
  std::vector<double> twice = cv;
  for (double& v : twice) v *= 2;
  expect_near(out.contiguous().to_doubles(), twice);
  EXPECT_THROW(ops::matmul_into(a, b, out, false, false, 1.f, 1.f, &wide_in), Error);  // other shape and strides
  const Tensor overlap = wide_out.narrow(1, 1, 6);
  EXPECT_THROW(ops::matmul_into(a, b, out, false, false, 1.f, 1.f, &overlap), Error);
}

}  // namespace
}  // namespace loom::test
