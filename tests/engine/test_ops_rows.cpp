// A norm's output with spare columns after its rows (ops::rms_norm / add_rms_norm's `spare`, for the
// one-GEMM LoRA product of autograd/fn_lora.cpp) and the row views over it: the same values as
// without, rows that far apart, and views that never reach past their storage.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/ops.h"
#include "engine/tensor.h"

namespace loom::test {
namespace {

Tensor ramp(const Shape& s, float start, float step, DType dt) {
  std::vector<float> v(static_cast<size_t>(numel_of(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + step * float(i % 29) - 0.013f * float(i % 7);
  return Tensor::from_floats(v, s).to(dt);
}

TEST(OpsRows, NormWithSpareColumnsHasTheSameValues) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = ramp({2, 5, 24}, -1.f, 0.07f, dt), r = ramp({2, 5, 24}, 0.5f, -0.03f, dt);
    const Tensor w = ramp({24}, 0.8f, 0.01f, dt);
    const ops::RmsNormOut plain = ops::rms_norm(x, w, 1e-6f, true);
    const ops::RmsNormOut wide = ops::rms_norm(x, w, 1e-6f, true, 8);
    EXPECT_EQ(wide.y.shape(), x.shape());
    EXPECT_EQ(wide.y.strides(), (Shape{5 * 32, 32, 1}));
    EXPECT_EQ(wide.y.to_floats(), plain.y.to_floats());
    EXPECT_EQ(wide.rstd.to_floats(), plain.rstd.to_floats());
    const ops::AddRmsNormOut a = ops::add_rms_norm(x, r, w, 1e-6f, false), b = ops::add_rms_norm(x, r, w, 1e-6f, false, 48);
    EXPECT_EQ(b.y.strides()[1], 72);
    EXPECT_EQ(b.y.to_floats(), a.y.to_floats());
    EXPECT_EQ(b.h.to_floats(), a.h.to_floats());
    EXPECT_THROW(ops::rms_norm(x, w, 1e-6f, false, -1), Error);
  }
}

TEST(OpsRows, RowsOfIsAViewWhereTheRowsAreEvenlySpaced) {
  const Tensor x = ramp({2, 5, 24}, -1.f, 0.07f, DType::f32), w = ramp({24}, 0.8f, 0.01f, DType::f32);
  const Tensor y = ops::rms_norm(x, w, 1e-6f, false, 8).y;
  const Tensor rows = ops::rows_of(y);
  EXPECT_EQ(rows.shape(), (Shape{10, 24}));
  EXPECT_EQ(rows.strides(), (Shape{32, 1}));
  EXPECT_EQ(rows.data_ptr(), y.data_ptr());
  EXPECT_EQ(rows.to_floats(), y.to_floats());
  // Widened by the spare columns, and no further: the storage ends after the last row's 32nd column.
  const Tensor wide = ops::widen_rows(rows, 8);
  ASSERT_TRUE(wide.defined());
  EXPECT_EQ(wide.shape(), (Shape{10, 32}));
  EXPECT_FALSE(ops::widen_rows(rows, 9).defined());
  // A contiguous x is its own rows; it has no spare columns.
  EXPECT_EQ(ops::rows_of(x).data_ptr(), x.data_ptr());
  EXPECT_FALSE(ops::widen_rows(ops::rows_of(x), 1).defined());
  // Rows that are not evenly spaced (a transposed view) are copied.
  const Tensor t = x.transpose(0, 1);
  const Tensor tr = ops::rows_of(t);
  EXPECT_TRUE(tr.is_contiguous());
  EXPECT_EQ(tr.to_floats(), t.contiguous().to_floats());
  // Rows of a larger buffer: widened within the row stride, and not where the last row's columns
  // would run past the storage's end.
  const Tensor cut = Tensor::zeros({4, 10}, DType::f32).narrow(1, 0, 6).narrow(0, 1, 3);
  EXPECT_TRUE(ops::widen_rows(cut, 4).defined());
  EXPECT_FALSE(ops::widen_rows(cut, 5).defined());
  EXPECT_FALSE(ops::widen_rows(Tensor::zeros({3, 8}, DType::f32).narrow(1, 2, 6), 2).defined());
}

TEST(OpsRows, CopyRowsWritesOnlyItsColumns) {
  Tensor buf = Tensor::full({3, 7}, NAN, DType::f32);
  Tensor mid = buf.narrow(1, 2, 3);
  ops::copy_rows_(mid, ramp({3, 3}, 1.f, 1.f, DType::f32));
  const std::vector<float> v = buf.to_floats();
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 7; ++c) {
      const float got = v[size_t(r * 7 + c)];
      if (c >= 2 && c < 5) EXPECT_FALSE(std::isnan(got)) << r << "," << c;
      else EXPECT_TRUE(std::isnan(got)) << r << "," << c;
    }
  EXPECT_EQ(mid.contiguous().to_floats(), ramp({3, 3}, 1.f, 1.f, DType::f32).to_floats());
  Tensor wrong = buf.narrow(1, 0, 2);
  EXPECT_THROW(ops::copy_rows_(wrong, ramp({3, 3}, 1.f, 1.f, DType::f32)), Error);
  Tensor bf = Tensor::zeros({3, 3}, DType::bf16);
  EXPECT_THROW(ops::copy_rows_(bf, ramp({3, 3}, 1.f, 1.f, DType::f32)), Error);
}

}  // namespace
}  // namespace loom::test
