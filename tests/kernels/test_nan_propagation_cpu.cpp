// A NaN input must give a NaN output in every CPU max/softmax: attention (forward, backward,
// decode), cross-entropy, the fused linear cross-entropy and RMSNorm. A max that drops NaN (std::max,
// fmaxf) would hide a broken model behind a finite loss and let training save NaN weights.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_decode.h"
#include "kernels/cross_entropy.h"
#include "kernels/linear_cross_entropy.h"
#include "kernels/norm.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <class T>
T nan_of() {
  return from_acc<T>(static_cast<Acc<T>>(kNaN));
}

template <class T>
bool is_nan(T x) {
  return std::isnan(double(to_acc(x)));
}

AttentionParams one_head(int64_t seq, int64_t d) {
  AttentionParams p;
  p.batch = 1, p.seq = seq, p.heads = 1, p.kv_heads = 1, p.head_dim = d;
  p.scale = 1.f / std::sqrt(float(d));
  return p;
}

template <class T>
class NanPropagationCpu : public ::testing::Test {};
using Types = ::testing::Types<float, double, bf16>;
TYPED_TEST_SUITE(NanPropagationCpu, Types);

// A NaN in key j gives query i a NaN score exactly when i >= j (causal): those rows' out and lse
// are NaN, the rows before j match a clean run bit for bit. Keys 0 (the first score, where a
// dropping max would start from -inf) and 3 (a later one) are both tried.
TYPED_TEST(NanPropagationCpu, AttentionForwardNanScore) {
  using T = TypeParam;
  const int64_t seq = 6, d = 4;
  const AttentionParams p = one_head(seq, d);
  const auto q = random_vec<T>(seq * d, 1), v = random_vec<T>(seq * d, 3);
  const auto k_clean = random_vec<T>(seq * d, 2);
  std::vector<T> out_clean(seq * d);
  std::vector<Acc<T>> lse_clean(seq);
  cpu::attention_forward(p, q.data(), k_clean.data(), v.data(), out_clean.data(), lse_clean.data());
  for (int64_t bad : {0, 3}) {
    auto k = k_clean;
    k[bad * d + 1] = nan_of<T>();
    std::vector<T> out(seq * d);
    std::vector<Acc<T>> lse(seq);
    cpu::attention_forward(p, q.data(), k.data(), v.data(), out.data(), lse.data());
    for (int64_t i = 0; i < seq; ++i) {
      EXPECT_EQ(std::isnan(double(lse[i])), i >= bad) << "key " << bad << " query " << i << " lse " << lse[i];
      for (int64_t x = 0; x < d; ++x) {
        if (i >= bad) EXPECT_TRUE(is_nan(out[i * d + x])) << "key " << bad << " query " << i;
        else EXPECT_EQ(double(to_acc(out[i * d + x])), double(to_acc(out_clean[i * d + x]))) << "query " << i;
      }
    }
  }
}

// An infinite score (an overflowed q.k) makes exp(inf - inf) = NaN: the row is NaN, not zero.
TYPED_TEST(NanPropagationCpu, AttentionForwardInfiniteScore) {
  using T = TypeParam;
  const int64_t seq = 3, d = 2;
  const AttentionParams p = one_head(seq, d);
  auto q = random_vec<T>(seq * d, 4), k = random_vec<T>(seq * d, 5), v = random_vec<T>(seq * d, 6);
  q[2 * d] = from_acc<T>(static_cast<Acc<T>>(INFINITY));  // query 2 scores +-inf against every key
  k[0] = k[d] = k[2 * d] = from_acc<T>(Acc<T>(1));
  std::vector<T> out(seq * d);
  std::vector<Acc<T>> lse(seq);
  cpu::attention_forward(p, q.data(), k.data(), v.data(), out.data(), lse.data());
  EXPECT_TRUE(is_nan(out[2 * d])) << double(to_acc(out[2 * d]));
  EXPECT_FALSE(std::isfinite(double(lse[2])));
  EXPECT_FALSE(is_nan(out[0]));
}

// A NaN in the values reaches the gradients of the rows that see it.
TYPED_TEST(NanPropagationCpu, AttentionBackwardNan) {
  using T = TypeParam;
  const int64_t seq = 5, d = 4;
  const AttentionParams p = one_head(seq, d);
  auto q = random_vec<T>(seq * d, 7), v = random_vec<T>(seq * d, 9), dout = random_vec<T>(seq * d, 10);
  auto k = random_vec<T>(seq * d, 8);
  k[2 * d] = nan_of<T>();
  std::vector<T> out(seq * d), dq(seq * d), dk(seq * d), dv(seq * d);
  std::vector<Acc<T>> lse(seq);
  cpu::attention_forward(p, q.data(), k.data(), v.data(), out.data(), lse.data());
  cpu::attention_backward(p, q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), dq.data(), dk.data(),
                          dv.data());
  EXPECT_TRUE(is_nan(dq[4 * d])) << "query 4 sees key 2";
  EXPECT_TRUE(is_nan(dv[2 * d])) << "key 2's value gradient";
  EXPECT_FALSE(is_nan(dq[1 * d])) << "query 1 does not see key 2";
}

// Decode: one NaN score among the cached keys gives a NaN output; the first and a later key.
TYPED_TEST(NanPropagationCpu, AttentionDecodeNanScore) {
  using T = TypeParam;
  DecodeParams p;
  p.batch = 1, p.heads = 2, p.kv_heads = 1, p.head_dim = 4, p.capacity = 6, p.length = 5;
  p.scale = 0.5f;
  const auto q = random_vec<T>(2 * 4, 11), v = random_vec<T>(6 * 4, 13);
  for (int64_t bad : {0, 3}) {
    auto k = random_vec<T>(6 * 4, 12);
    k[bad * 4 + 2] = nan_of<T>();
    std::vector<T> out(2 * 4);
    cpu::attention_decode(p, q.data(), k.data(), v.data(), out.data());
    for (const T& x : out) EXPECT_TRUE(is_nan(x)) << "key " << bad;
  }
}

// Cross-entropy: a NaN logit anywhere in a counted row gives NaN lse and loss (the first logit,
// where a dropping max starts, and a later one); the other rows stay finite.
TYPED_TEST(NanPropagationCpu, CrossEntropyNanLogit) {
  using T = TypeParam;
  const int64_t n = 3, vocab = 7;
  for (int64_t bad : {0, 4}) {
    auto logits = random_vec<T>(n * vocab, 14);
    logits[1 * vocab + bad] = nan_of<T>();
    const std::vector<int32_t> targets = {2, 5, 0};
    std::vector<Acc<T>> loss(n), lse(n);
    cpu::cross_entropy_forward(logits.data(), targets.data(), loss.data(), lse.data(), n, vocab, 0.f, kIgnoreIndex);
    EXPECT_TRUE(std::isnan(double(lse[1]))) << "logit " << bad;
    EXPECT_TRUE(std::isnan(double(loss[1]))) << "logit " << bad;
    EXPECT_TRUE(std::isfinite(double(loss[0])) && std::isfinite(double(loss[2])));
    std::vector<Acc<T>> dloss(n, Acc<T>(1));
    std::vector<T> dlogits(n * vocab);
    cpu::cross_entropy_backward(logits.data(), targets.data(), lse.data(), dloss.data(), dlogits.data(), n, vocab, 0.f,
                                kIgnoreIndex);
    EXPECT_TRUE(is_nan(dlogits[1 * vocab + 6])) << "logit " << bad;
  }
}

// An infinite logit: lse is inf - inf territory; the loss must not come out finite.
TYPED_TEST(NanPropagationCpu, CrossEntropyInfiniteLogit) {
  using T = TypeParam;
  auto logits = random_vec<T>(5, 15);
  logits[3] = from_acc<T>(static_cast<Acc<T>>(INFINITY));
  const int32_t target = 3;
  Acc<T> loss, lse;
  cpu::cross_entropy_forward(logits.data(), &target, &loss, &lse, 1, 5, 0.f, kIgnoreIndex);
  EXPECT_FALSE(std::isfinite(double(loss))) << loss;
}

// Fused lm_head + loss: a NaN in one vocabulary row of the head (the first, a later one) makes the
// mean loss and the hidden-state gradients NaN.
TYPED_TEST(NanPropagationCpu, LinearCrossEntropyNanWeight) {
  using T = TypeParam;
  const int64_t n = 4, vocab = 9, hidden = 5;
  const auto h = random_vec<T>(n * hidden, 16);
  const std::vector<int32_t> targets = {1, kIgnoreIndex, 8, 3};
  for (int64_t bad : {0, 6}) {
    auto w = random_vec<T>(vocab * hidden, 17);
    w[bad * hidden + 2] = nan_of<T>();
    Acc<T> loss = 0;
    std::vector<T> dh(n * hidden);
    std::vector<Acc<T>> dw(vocab * hidden);
    cpu::linear_cross_entropy(h.data(), w.data(), targets.data(), &loss, dh.data(), dw.data(), n, vocab, hidden, 0.f,
                              kIgnoreIndex, 0);
    EXPECT_TRUE(std::isnan(double(loss))) << "vocab row " << bad << " loss " << loss;
    EXPECT_TRUE(is_nan(dh[0])) << "vocab row " << bad;
  }
}

// RMSNorm: a NaN in a row makes that row (and only it) NaN, forward and backward.
TYPED_TEST(NanPropagationCpu, RmsNormNanInput) {
  using T = TypeParam;
  const int64_t rows = 3, cols = 6;
  auto x = random_vec<T>(rows * cols, 18);
  const auto w = random_vec<T>(cols, 19), dy = random_vec<T>(rows * cols, 20);
  x[1 * cols + 4] = nan_of<T>();
  std::vector<T> y(rows * cols), dx(rows * cols);
  std::vector<Acc<T>> rstd(rows), dw(cols, Acc<T>(0));
  cpu::rms_norm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, cols, 1e-6f, false);
  cpu::rms_norm_backward(x.data(), w.data(), rstd.data(), dy.data(), dx.data(), dw.data(), rows, cols, false);
  for (int64_t c = 0; c < cols; ++c) {
    EXPECT_TRUE(is_nan(y[1 * cols + c]) && is_nan(dx[1 * cols + c])) << "column " << c;
    EXPECT_FALSE(is_nan(y[0 * cols + c]) || is_nan(y[2 * cols + c])) << "column " << c;
    EXPECT_TRUE(std::isnan(double(dw[c]))) << "column " << c;
  }
}

}  // namespace
}  // namespace loom::test
