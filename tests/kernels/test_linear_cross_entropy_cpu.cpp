// CPU fused linear + cross-entropy against the unfused path (cpu::gemm logits, then the
// cross-entropy kernels and two more GEMMs) in f64 and f32, and against f64 finite differences.
#include <cmath>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/cross_entropy.h"
#include "kernels/gemm.h"
#include "kernels/linear_cross_entropy.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

struct Case {
  int64_t n, vocab, hidden, chunk;
  float softcap;
};
// chunk < n and n not a multiple of chunk; chunk 0 (default: one chunk); chunk > n; all with and
// without a soft-cap that bends the logits (h, w uniform in [-1, 1): |logit| up to ~hidden/3).
const Case kCases[] = {{7, 23, 16, 3, 0.f}, {7, 23, 16, 3, 2.f}, {9, 50, 8, 4, 1.5f},
                       {5, 31, 12, 0, 0.f}, {5, 31, 12, 64, 3.f}, {1, 1, 4, 1, 0.f}};

std::vector<int32_t> make_targets(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i % 3 == 1 ? kIgnoreIndex : static_cast<int32_t>(gen() % vocab);
  return t;
}

template <class T>
constexpr GemmType gtype() {
  return std::is_same_v<T, double> ? GemmType::kF64 : GemmType::kF32;
}

template <class T>
struct Result {
  double loss;
  std::vector<T> dh;
  std::vector<T> dw;
};

// The unfused composition ag::cross_entropy(ag::linear(h, w)) computes, on raw pointers.
// bf16_logits: the logits are rounded to bf16 before the loss (what a bf16 lm_head hands it).
template <class T>
Result<T> unfused(const std::vector<T>& h, const std::vector<T>& w, const std::vector<int32_t>& t, const Case& c,
                  bool bf16_logits = false) {
  const int64_t n = c.n, V = c.vocab, H = c.hidden;
  std::vector<T> logits(n * V), dl(n * V), dloss(n);
  std::vector<T> loss(n), lse(n);
  GemmArgs g;  // logits [n, V] = h [n, H] w^T
  g.m = n, g.n = V, g.k = H, g.trans_b = true, g.a = h.data(), g.lda = H, g.b = w.data(), g.ldb = H;
  g.c = logits.data(), g.ldc = V, g.ab_type = g.c_type = gtype<T>();
  cpu::gemm(g);
  if (bf16_logits)
    for (T& x : logits) x = T(bf16_to_float(float_to_bf16(float(x))));
  cpu::cross_entropy_forward(logits.data(), t.data(), loss.data(), lse.data(), n, V, c.softcap, kIgnoreIndex);
  int64_t count = 0;
  for (int32_t x : t) count += x != kIgnoreIndex;
  Result<T> r{0, std::vector<T>(n * H), std::vector<T>(V * H)};
  for (int64_t i = 0; i < n; ++i) r.loss += double(loss[i]);
  r.loss = count ? r.loss / double(count) : 0.0;
  for (auto& x : dloss) x = count ? T(1) / T(count) : T(0);
  cpu::cross_entropy_backward(logits.data(), t.data(), lse.data(), dloss.data(), dl.data(), n, V, c.softcap,
                              kIgnoreIndex);
  GemmArgs d;  // dh [n, H] = dl [n, V] w [V, H]
  d.m = n, d.n = H, d.k = V, d.a = dl.data(), d.lda = V, d.b = w.data(), d.ldb = H, d.c = r.dh.data(), d.ldc = H;
  d.ab_type = d.c_type = gtype<T>();
  cpu::gemm(d);
  GemmArgs e;  // dw [V, H] = dl^T [V, n] h [n, H]
  e.m = V, e.n = H, e.k = n, e.trans_a = true, e.a = dl.data(), e.lda = V, e.b = h.data(), e.ldb = H;
  e.c = r.dw.data(), e.ldc = H, e.ab_type = e.c_type = gtype<T>();
  cpu::gemm(e);
  return r;
}

template <class T>
Result<T> fused(const std::vector<T>& h, const std::vector<T>& w, const std::vector<int32_t>& t, const Case& c) {
  // dw starts as NaN: the kernel must overwrite it, not accumulate into it.
  Result<T> r{0, std::vector<T>(c.n * c.hidden), std::vector<T>(c.vocab * c.hidden, T(NAN))};
  T loss = 0;
  cpu::linear_cross_entropy(h.data(), w.data(), t.data(), &loss, r.dh.data(), r.dw.data(), c.n, c.vocab, c.hidden,
                            c.softcap, kIgnoreIndex, c.chunk);
  r.loss = double(loss);
  return r;
}

// Fused and unfused differ only in summation order and where 1/count is applied: ~1e-15
// relative in f64, ~1e-6 in f32 (vocab-length sums of f32 terms); 1e-12 and 2e-5 leave margin.
template <class T>
void check_against_unfused(double tol) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << "n=" << c.n << " vocab=" << c.vocab << " hidden=" << c.hidden
                                    << " chunk=" << c.chunk << " softcap=" << c.softcap);
    const auto h = random_vec<T>(c.n * c.hidden, 1), w = random_vec<T>(c.vocab * c.hidden, 2);
    const auto t = make_targets(c.n, c.vocab, 3);
    const Result<T> a = fused(h, w, t, c), b = unfused(h, w, t, c);
    EXPECT_NEAR(a.loss, b.loss, tol * std::max(1.0, std::abs(b.loss)));
    EXPECT_LT(rel_error(a.dh, b.dh), tol);
    EXPECT_LT(rel_error(a.dw, b.dw), tol);
  }
}

TEST(LinearCrossEntropyCpu, MatchesUnfusedF64) { check_against_unfused<double>(1e-12); }
TEST(LinearCrossEntropyCpu, MatchesUnfusedF32) { check_against_unfused<float>(2e-5); }

// bf16 in: logits accumulate in f32 and are rounded to bf16 (as transformers' bf16 lm_head gives
// them; kernels/linear_cross_entropy.h), the loss is taken in f32 from them, dlogits and dh are
// rounded to bf16. Against the f64 unfused path of the same bf16 inputs with its logits rounded
// the same way: the loss to f32 summation (1e-5), the gradients at bf16's ~1e-2.
TEST(LinearCrossEntropyCpu, Bf16CloseToF64) {
  const Case c{7, 23, 16, 3, 2.f};
  const auto hb = random_vec<bf16>(c.n * c.hidden, 1), wb = random_vec<bf16>(c.vocab * c.hidden, 2);
  const auto t = make_targets(c.n, c.vocab, 3);
  std::vector<double> h(hb.size()), w(wb.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = to_acc(hb[i]);
  for (size_t i = 0; i < w.size(); ++i) w[i] = to_acc(wb[i]);
  const Result<double> ref = unfused(h, w, t, c, /*bf16_logits=*/true);
  std::vector<bf16> dh(c.n * c.hidden);
  std::vector<float> dw(c.vocab * c.hidden, NAN);
  float loss = 0;
  cpu::linear_cross_entropy(hb.data(), wb.data(), t.data(), &loss, dh.data(), dw.data(), c.n, c.vocab, c.hidden,
                            c.softcap, kIgnoreIndex, c.chunk);
  EXPECT_NEAR(loss, ref.loss, 1e-5 * std::max(1.0, ref.loss));  // the same logits, f32 against f64 sums
  EXPECT_LT(rel_error(dh, ref.dh), 1e-2);
  EXPECT_LT(rel_error(dw, ref.dw), 1e-2);
}

// Central differences of the fused loss in f64 (truncation ~h^2, rounding ~1e-16/h): 1e-6.
TEST(LinearCrossEntropyCpu, GradientsMatchFiniteDifferences) {
  for (const Case& c : {Case{5, 11, 6, 2, 0.f}, Case{5, 11, 6, 2, 2.f}}) {
    SCOPED_TRACE(testing::Message() << "softcap=" << c.softcap);
    auto h = random_vec<double>(c.n * c.hidden, 4), w = random_vec<double>(c.vocab * c.hidden, 5);
    const auto t = make_targets(c.n, c.vocab, 6);
    const Result<double> g = fused(h, w, t, c);
    auto loss_at = [&] {
      double l = 0;
      cpu::linear_cross_entropy<double>(h.data(), w.data(), t.data(), &l, nullptr, nullptr, c.n, c.vocab, c.hidden,
                                        c.softcap, kIgnoreIndex, c.chunk);
      return l;
    };
    const double step = 1e-6;
    auto fd = [&](std::vector<double>& x, size_t i) {
      const double x0 = x[i];
      x[i] = x0 + step;
      const double up = loss_at();
      x[i] = x0 - step;
      const double down = loss_at();
      x[i] = x0;
      return (up - down) / (2 * step);
    };
    for (size_t i = 0; i < h.size(); ++i) EXPECT_NEAR(g.dh[i], fd(h, i), 1e-6) << "dh[" << i << "]";
    for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(g.dw[i], fd(w, i), 1e-6) << "dw[" << i << "]";
  }
}

TEST(LinearCrossEntropyCpu, AllIgnoredGivesZero) {
  const Case c{4, 9, 5, 3, 0.f};
  const auto h = random_vec<float>(c.n * c.hidden, 1), w = random_vec<float>(c.vocab * c.hidden, 2);
  const std::vector<int32_t> t(c.n, kIgnoreIndex);
  const Result<float> r = fused(h, w, t, c);
  EXPECT_EQ(r.loss, 0.0);
  for (float x : r.dh) EXPECT_EQ(x, 0.f);
  for (float x : r.dw) EXPECT_EQ(x, 0.f);
}

TEST(LinearCrossEntropyCpu, BadTargetThrowsNamingRow) {
  const auto h = random_vec<float>(3 * 4, 1), w = random_vec<float>(5 * 4, 2);
  const std::vector<int32_t> t = {1, 5, 0};
  float loss = 0;
  try {
    cpu::linear_cross_entropy<float>(h.data(), w.data(), t.data(), &loss, nullptr, nullptr, 3, 5, 4, 0.f, kIgnoreIndex, 2);
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::test
