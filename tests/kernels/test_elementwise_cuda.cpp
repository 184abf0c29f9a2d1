// CUDA elementwise kernels, strided copies and reductions against the CPU reference: odd sizes,
// pack tails, misaligned pointers (the scalar fallbacks), several grid-stride iterations, the
// tiled (batched) transpose and the contiguous-innermost-dim copy.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "kernels/elementwise.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

template <class T>
class ElementwiseCuda : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(ElementwiseCuda, Types);

// n host elements placed `off` elements into a fresh (poisoned) device buffer: off = 1 makes the
// pointer misaligned for 16-byte accesses and forces the kernels' scalar paths.
template <class T>
class Placed {
 public:
  Placed(size_t n, size_t off) : buf_(n + off), n_(n), off_(off) {}
  Placed(const std::vector<T>& h, size_t off) : Placed(h.size(), off) {
    cudaMemcpy(get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  T* get() { return buf_.get() + off_; }
  std::vector<T> to_host() const {
    const auto all = buf_.to_host();
    return std::vector<T>(all.begin() + static_cast<std::ptrdiff_t>(off_), all.end());
  }

 private:
  DeviceBuffer<T> buf_;
  size_t n_, off_;
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Pointer offsets (a, b, out) in elements: all aligned, all misaligned, only the output misaligned.
const size_t kOffsets[][3] = {{0, 0, 0}, {1, 1, 1}, {0, 0, 1}};
// Sizes around the 16-byte pack (4 f32 / 8 bf16), and large enough for several grid-stride
// iterations (the grid holds at most 4 * SMs * 256 threads).
const int64_t kSizes[] = {1, 7, 8, 9, 31, 1000, 65537, 3000001};

// f32: the GPU may contract alpha * a + beta * b into one FMA and its tanhf differs from
// std::tanh by <= 2 ulp, so elements differ by a few f32 ulps (rel. L2 << 1e-5). bf16: one
// rounding to bf16 on both sides, occasionally flipped by those f32 differences: tol<bf16>().
TYPED_TEST(ElementwiseCuda, MapsMatchCpuAlignedAndMisaligned) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  for (const auto& off : kOffsets)
    for (int64_t n : kSizes) {
      const std::string where = "n=" + std::to_string(n) + " offsets=" + std::to_string(off[0]) +
                                std::to_string(off[1]) + std::to_string(off[2]);
      auto a = random_vec<T>(n, 1 + n, -4.f, 4.f), b = random_vec<T>(n, 2 + n);
      std::vector<T> ref(n);
      Placed<T> da(a, off[0]), db(b, off[1]), out(n, off[2]);
      cpu::axpby(a.data(), b.data(), ref.data(), n, 0.5f, -2.f);
      cuda::axpby(da.get(), db.get(), out.get(), n, 0.5f, -2.f, nullptr);
      EXPECT_LT(rel_error(out.to_host(), ref), tol<T>()) << "axpby " << where;
      cpu::mul(a.data(), b.data(), ref.data(), n);
      cuda::mul(da.get(), db.get(), out.get(), n, nullptr);
      EXPECT_LT(rel_error(out.to_host(), ref), tol<T>()) << "mul " << where;
      cpu::scale(a.data(), ref.data(), n, 3.f);
      cuda::scale(da.get(), out.get(), n, 3.f, nullptr);
      EXPECT_LT(rel_error(out.to_host(), ref), tol<T>()) << "scale " << where;
      cpu::softcap_forward(a.data(), ref.data(), n, 3.f);
      cuda::softcap_forward(da.get(), out.get(), n, 3.f, nullptr);
      EXPECT_LT(rel_error(out.to_host(), ref), tol<T>()) << "softcap_forward " << where;
      cpu::softcap_backward(a.data(), b.data(), ref.data(), n, 3.f);
      cuda::softcap_backward(da.get(), db.get(), out.get(), n, 3.f, nullptr);
      EXPECT_LT(rel_error(out.to_host(), ref), tol<T>()) << "softcap_backward " << where;
      cpu::fill(ref.data(), n, -1.3f);
      cuda::fill(out.get(), n, -1.3f, nullptr);
      EXPECT_TRUE(same_bits(out.to_host(), ref)) << "fill " << where;  // one rounding, same on both
    }
}

// scale_blocks: the listed blocks of a buffer (1000 of 1200 blocks of 33: two launches of
// kScaleBlocksPerLaunch; and 3 of 5 blocks of 70001 elements, several grid-stride passes), beta 0 over
// NaNs, 3 and 1, bit for bit as the CPU version (NaN as any NaN) (one product and one rounding on both); the unlisted
// blocks and a canary past the end keep their bits.
TYPED_TEST(ElementwiseCuda, ScaleBlocksMatchCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  const int64_t shapes[][2] = {{1200, 33}, {5, 70001}};
  for (const auto& sh : shapes)
    for (float beta : {0.f, 3.f, 1.f}) {
      const int64_t blocks = sh[0], block = sh[1];
      std::vector<int32_t> listed;
      for (int64_t b = blocks - 1; b >= 0; b -= (blocks > 100 ? 1 : 2))
        if (blocks <= 100 || b % 6 != 1) listed.push_back(int32_t(b));
      std::vector<T> x = random_vec<T>(size_t(blocks * block + 64), 31 + uint32_t(block), -4.f, 4.f);
      for (size_t i = 0; i < x.size(); i += 97) x[i] = from_acc<T>(NAN);
      std::vector<T> ref = x;
      cpu::scale_blocks(ref.data(), block, listed.data(), int64_t(listed.size()), beta);
      Placed<T> d(x, 0);
      cuda::scale_blocks(d.get(), block, listed.data(), int64_t(listed.size()), beta, nullptr);
      const std::string where = std::to_string(listed.size()) + " of " + std::to_string(blocks) + " blocks of " +
                                std::to_string(block) + " beta " + std::to_string(beta);
      // Bit for bit, but a NaN as any NaN (the GPU's arithmetic gives the canonical one, x86 the input's).
      const std::vector<T> got = d.to_host();
      int64_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const bool nan_both = std::isnan(double(to_acc(got[i]))) && std::isnan(double(to_acc(ref[i])));
        if (!nan_both && std::memcmp(&got[i], &ref[i], sizeof(T)) != 0) ++bad;
      }
      EXPECT_EQ(bad, 0) << where;
    }
}

// In place (out == a): every element is read before it is written, by the same thread.
TYPED_TEST(ElementwiseCuda, InPlaceMapsMatchCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  for (size_t off : {0, 1})
    for (int64_t n : {9, 65537, 3000001}) {
      auto a = random_vec<T>(n, 3 + n), b = random_vec<T>(n, 4 + n);
      std::vector<T> ref(n);
      cpu::axpby(a.data(), b.data(), ref.data(), n, 1.f, 1.f);
      Placed<T> da(a, off), db(b, off);
      cuda::axpby(da.get(), db.get(), da.get(), n, 1.f, 1.f, nullptr);
      EXPECT_LT(rel_error(da.to_host(), ref), tol<T>()) << "n=" << n << " off=" << off;
    }
}

TYPED_TEST(ElementwiseCuda, AddBiasMatchesCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  // cols % 8 == 0 takes the vector path when aligned; 129 and 7 always take the scalar path.
  const int64_t shapes[][2] = {{37, 129}, {64, 256}, {3, 8}, {5, 7}, {1000, 1032}};
  for (size_t off : {0, 1})
    for (const auto& sh : shapes) {
      const int64_t rows = sh[0], cols = sh[1];
      auto a = random_vec<T>(rows * cols, 3 + cols), bias = random_vec<T>(cols, 4 + rows);
      std::vector<T> ref(rows * cols);
      Placed<T> da(a, off), dbias(bias, off), out(rows * cols, off);
      cpu::add_bias(a.data(), bias.data(), ref.data(), rows, cols);
      cuda::add_bias(da.get(), dbias.get(), out.get(), rows, cols, nullptr);
      EXPECT_LT(rel_error(out.to_host(), ref), tol<T>()) << rows << "x" << cols << " off=" << off;
    }
}

// Column sums, T -> T and (bf16) T -> f32, with and without accumulation. The GPU adds in f32 in
// a different order than the CPU's f64: for up to 4097 rows of values in [-1, 1) the error is a
// few f32 ulps of the column sum (rel. L2 < 1e-5); a bf16 output adds one rounding (tol<bf16>).
// The summation order depends on the shape only, so the misaligned (scalar) path gives the same
// bits as the aligned (vector) one, and two runs give the same bits.
template <class T, class O>
void check_sum_rows(int64_t rows, int64_t cols, bool accumulate) {
  const std::string where = std::to_string(rows) + "x" + std::to_string(cols) + " acc=" + std::to_string(accumulate);
  auto a = random_vec<T>(rows * cols, 5 + rows + cols);
  const auto init = random_vec<O>(cols, 6 + cols);
  auto ref = init;
  cpu::sum_rows(a.data(), ref.data(), rows, cols, accumulate);
  const size_t ws_bytes = cuda::sum_rows_workspace_bytes(rows, cols);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  std::vector<O> first;
  for (size_t off : {0, 1, 0}) {
    Placed<T> da(a, off);
    Placed<O> out(init, off);
    cuda::sum_rows(da.get(), out.get(), rows, cols, accumulate, ws_bytes ? ws.get() : nullptr, nullptr);
    const auto got = out.to_host();
    EXPECT_LT(rel_error(got, ref), tol<O>()) << where << " off=" << off;
    if (first.empty())
      first = got;
    else
      EXPECT_TRUE(same_bits(got, first)) << "sum_rows is not deterministic " << where << " off=" << off;
  }
}

TYPED_TEST(ElementwiseCuda, SumRowsMatchCpuAndAreDeterministic) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  // One split (rows <= 64), two splits, many splits with vector / scalar columns, a single column.
  const int64_t shapes[][2] = {{37, 129}, {0, 40}, {1, 8}, {65, 16}, {1000, 264}, {1000, 130}, {300, 1}, {4097, 4096}};
  for (const auto& sh : shapes)
    for (bool acc : {false, true}) {
      check_sum_rows<T, T>(sh[0], sh[1], acc);
      if constexpr (std::is_same_v<T, bf16>) check_sum_rows<T, float>(sh[0], sh[1], acc);
    }
}

StridedLayout layout(std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides) {
  StridedLayout l;
  l.ndim = static_cast<int>(shape.size());
  int d = 0;
  for (int64_t s : shape) l.shape[d++] = s;
  d = 0;
  for (int64_t s : strides) l.strides[d++] = s;
  return l;
}

int64_t numel(const StridedLayout& l) {
  int64_t n = 1;
  for (int d = 0; d < l.ndim; ++d) n *= l.shape[d];
  return n;
}
int64_t span(const StridedLayout& l) {  // source elements a view reaches (strides >= 0)
  int64_t last = 0;
  for (int d = 0; d < l.ndim; ++d) last += (l.shape[d] - 1) * l.strides[d];
  return last + 1;
}

// Views covering every path: contiguous (1-D, and N-D that simplifies to 1-D), 2-D transposes
// (tiled, and too thin for tiles), batched transposes (batch dims merged, a permuted batch, more
// tile rows / batches than the grid's 65535 limit), a [B, S, H, D] -> [B, H, S, D] permute with a
// contiguous D (16-byte packs when D % 8 == 0), and a size-1 dim.
std::vector<StridedLayout> copy_layouts() {
  return {
      layout({1000}, {1}),
      layout({3, 5, 67}, {335, 67, 1}),
      layout({65, 33}, {1, 65}),                             // transpose of [33, 65]
      layout({64, 64}, {1, 64}),                             // transpose of [64, 64]
      layout({100, 7}, {1, 100}),                            // d1 < 8: generic
      layout({7, 100}, {1, 7}),                              // d0 < 8: generic
      layout({3, 70, 37}, {37 * 70, 1, 70}),                 // batched: [3, 37, 70] -> [3, 70, 37]
      layout({3, 70, 37}, {70, 1, 210}),                     // [37, 3, 70] viewed as [3, 70, 37]
      layout({2, 3, 40, 33}, {3 * 33 * 40, 33 * 40, 1, 40}), // 4-D, batch dims merge
      layout({8, 2100000}, {1, 8}),                          // 65625 tiles along d1 (grid x)
      layout({2100000, 8}, {1, 2100000}),                    // 65625 tiles along d0 > 65535 (grid y)
      layout({70000, 8, 9}, {72, 1, 8}),                     // 70000 batches > 65535
      layout({2, 3, 5, 16}, {240, 16, 48, 1}),               // [2, 5, 3, 16] -> [2, 3, 5, 16]
      layout({2, 3, 5, 5}, {75, 5, 15, 1}),                  // same with D = 5: generic
      layout({9, 1, 12}, {1, 999, 9}),                       // size-1 dim dropped, then a transpose
  };
}

// Gathers and f32 <-> bf16 casts are exact (RNE on both sides): results must match bit for bit.
template <class S, class D>
void check_copy(const StridedLayout& l, size_t off, uint32_t seed) {
  const int64_t n = numel(l);
  const auto src = random_vec<S>(span(l), seed);
  std::vector<D> ref(n);
  cpu::copy_strided(src.data(), l, ref.data());
  Placed<S> ds(src, off);
  Placed<D> dd(n, off);
  cuda::copy_strided(ds.get(), l, dd.get(), nullptr);
  int64_t bad = 0;
  const auto got = dd.to_host();
  for (int64_t i = 0; i < n; ++i) bad += std::memcmp(&got[i], &ref[i], sizeof(D)) != 0;
  EXPECT_EQ(bad, 0) << "ndim=" << l.ndim << " shape0=" << l.shape[0] << " n=" << n << " off=" << off;
}

TYPED_TEST(ElementwiseCuda, StridedCopiesAndCastsMatchCpuExactly) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  using Other = std::conditional_t<std::is_same_v<T, float>, bf16, float>;
  uint32_t seed = 10;
  for (const auto& l : copy_layouts())
    for (size_t off : {0, 1}) {
      check_copy<T, T>(l, off, ++seed);
      check_copy<T, Other>(l, off, ++seed);
    }
}

TEST(ElementwiseCudaBytes, StridedByteCopiesMatchCpuExactly) {
  LOOM_REQUIRE_GPU();
  uint32_t seed = 100;
  for (int es : {1, 2, 4, 8})
    for (const auto& l : copy_layouts())
      for (size_t off : {0, 1}) {
        const int64_t n = numel(l);
        std::vector<uint8_t> bytes(static_cast<size_t>(span(l)) * es);
        std::mt19937 gen(++seed);
        for (size_t i = 0; i < bytes.size(); i += 4) {
          const uint32_t w = gen();
          std::memcpy(&bytes[i], &w, std::min<size_t>(4, bytes.size() - i));
        }
        std::vector<uint8_t> ref(static_cast<size_t>(n) * es);
        cpu::copy_strided_bytes(bytes.data(), l, ref.data(), es);
        Placed<uint8_t> ds(bytes, off * es), dd(ref.size(), off * es);
        cuda::copy_strided_bytes(ds.get(), l, dd.get(), es, nullptr);
        EXPECT_TRUE(same_bits(dd.to_host(), ref)) << "elem_size=" << es << " ndim=" << l.ndim << " n=" << n
                                                  << " off=" << off;
      }
}

// sum / sum of squares: f32 accumulation of n terms of magnitude <= 1 against the CPU's f64, error
// bound ~ n * 2^-24 * sum|a|. The order is fixed per n (and device), the same for the vector and
// the scalar path: a misaligned copy of the data gives the same bits, as does a second run.
TYPED_TEST(ElementwiseCuda, ReductionsMatchCpuAndAreDeterministic) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  for (int64_t n : {1, 7, 255, 100003, 3000001}) {
    auto a = random_vec<T>(n, 6 + n);
    float ref_sum, ref_sq;
    cpu::sum(a.data(), n, &ref_sum);
    cpu::sum_squares(a.data(), n, &ref_sq);
    DeviceBuffer<float> out(4), ws(cuda::kReduceWorkspaceFloats);
    Placed<T> da(a, 0), dmis(a, 1);
    cuda::sum(da.get(), n, out.get(), ws.get(), nullptr);
    cuda::sum_squares(da.get(), n, out.get() + 1, ws.get(), nullptr);
    cuda::sum(dmis.get(), n, out.get() + 2, ws.get(), nullptr);
    cuda::sum_squares(dmis.get(), n, out.get() + 3, ws.get(), nullptr);
    auto got = out.to_host();
    EXPECT_NEAR(got[0], ref_sum, 1e-5 * n + 1e-6) << "n=" << n;
    EXPECT_NEAR(got[1], ref_sq, 1e-6 * std::abs(ref_sq) + 1e-6) << "n=" << n;
    EXPECT_EQ(got[0], got[2]) << "sum: misaligned path differs, n=" << n;
    EXPECT_EQ(got[1], got[3]) << "sum_squares: misaligned path differs, n=" << n;
    cuda::sum(da.get(), n, out.get() + 1, ws.get(), nullptr);
    auto again = out.to_host();
    EXPECT_EQ(got[0], again[1]) << "reduction is not deterministic, n=" << n;
  }
}

}  // namespace
}  // namespace loom::test
