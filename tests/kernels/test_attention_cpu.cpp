// CPU attention against a naive f64 attention written here (full score matrix, explicit mask,
// softmax): forward outputs and lse, and backward against central finite differences of it.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/attention.h"
#include "kernels/rope.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

struct Case {
  const char* name;
  int64_t batch, seq, heads, kv_heads, d;
  float scale;  // 0 = 1/sqrt(d)
  float softcap;
  int64_t window;
  bool segments;
};

const Case kCases[] = {
    {"mha", 2, 7, 2, 2, 8, 0.f, 0.f, 0, false},
    {"gqa_odd_dim", 1, 9, 6, 2, 5, 0.f, 0.f, 0, false},
    {"window", 2, 10, 2, 1, 4, 0.f, 0.f, 3, false},
    {"softcap", 1, 8, 2, 2, 8, 1.f, 2.f, 0, false},
    {"segments", 2, 11, 4, 2, 6, 0.f, 0.f, 0, true},
    {"everything", 2, 12, 4, 2, 6, 1.f, 1.5f, 4, true},
    {"seq1", 2, 1, 2, 1, 3, 0.f, 0.f, 0, false},
    // Past one tile of 64 query rows (the kernels' unit of work): a second tile that sees the first
    // tile's keys, and with a window, segments and a cap, one whose first key is past 0.
    {"two_tiles", 1, 70, 2, 1, 4, 0.f, 0.f, 0, false},
    {"two_tiles_everything", 2, 70, 1, 1, 4, 1.f, 1.5f, 20, true},
};

// Batch 0: contiguous packed documents; batch 1: an interleaved pattern (the kernels must not
// assume segments are contiguous).
std::vector<int32_t> make_segments(const Case& c) {
  std::vector<int32_t> s(c.batch * c.seq);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.seq; ++i) s[b * c.seq + i] = b == 0 ? int32_t(i * 3 / c.seq) : int32_t((i * i) % 3 + 5);
  return s;
}

AttentionParams params_of(const Case& c, const std::vector<int32_t>& seg) {
  AttentionParams p;
  p.batch = c.batch; p.seq = c.seq; p.heads = c.heads; p.kv_heads = c.kv_heads; p.head_dim = c.d;
  p.scale = c.scale > 0.f ? c.scale : 1.f / std::sqrt(float(c.d));
  p.softcap = c.softcap;
  p.window = c.window;
  p.segment_ids = c.segments ? seg.data() : nullptr;
  return p;
}

// Naive f64 attention: S = cap(scale * Q K^T) with -inf where masked, P = softmax(S), out = P V.
std::vector<double> naive_attention(const AttentionParams& p, const std::vector<double>& q,
                                    const std::vector<double>& k, const std::vector<double>& v,
                                    std::vector<double>* lse = nullptr) {
  const int64_t S = p.seq, H = p.heads, G = p.kv_heads, D = p.head_dim, group = H / G;
  std::vector<double> out(q.size(), 0.0);
  if (lse) lse->assign(p.batch * H * S, 0.0);
  std::vector<double> score(S * S);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j) {
          bool visible = j <= i && (p.window == 0 || i - j < p.window);
          if (p.segment_ids) visible = visible && p.segment_ids[b * S + i] == p.segment_ids[b * S + j];
          double s = 0;
          for (int64_t x = 0; x < D; ++x) s += q[((b * S + i) * H + h) * D + x] * k[((b * S + j) * G + g) * D + x];
          s *= double(p.scale);
          if (p.softcap > 0.f) s = double(p.softcap) * std::tanh(s / double(p.softcap));
          score[i * S + j] = visible ? s : -std::numeric_limits<double>::infinity();
        }
      for (int64_t i = 0; i < S; ++i) {
        double m = -std::numeric_limits<double>::infinity(), z = 0;
        for (int64_t j = 0; j < S; ++j) m = std::max(m, score[i * S + j]);
        for (int64_t j = 0; j < S; ++j) z += std::exp(score[i * S + j] - m);
        if (lse) (*lse)[(b * H + h) * S + i] = m + std::log(z);
        for (int64_t j = 0; j < S; ++j) {
          const double w = std::exp(score[i * S + j] - m) / z;
          for (int64_t x = 0; x < D; ++x)
            out[((b * S + i) * H + h) * D + x] += w * v[((b * S + j) * G + g) * D + x];
        }
      }
    }
  return out;
}

template <class T>
std::vector<double> as_double(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = double(to_acc(v[i]));
  return out;
}

// Central differences of L = sum(naive_attention(q, k, v) * dout) in each element of x.
std::vector<double> finite_diff(const AttentionParams& p, std::vector<double> q, std::vector<double> k,
                                std::vector<double> v, const std::vector<double>& dout, int which) {
  std::vector<double>& x = which == 0 ? q : which == 1 ? k : v;
  std::vector<double> grad(x.size());
  const double eps = 1e-5;
  auto loss = [&] {
    auto o = naive_attention(p, q, k, v);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * dout[i];
    return l;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + eps;
    const double up = loss();
    x[i] = keep - eps;
    const double down = loss();
    x[i] = keep;
    grad[i] = (up - down) / (2 * eps);
  }
  return grad;
}

template <class T>
class AttentionCpu : public ::testing::Test {};
using Types = ::testing::Types<double, float, bf16>;
TYPED_TEST_SUITE(AttentionCpu, Types);

// Forward tolerances (relative L2; observed values in brackets): f64 only reorders sums (1e-16);
// f32 accumulates ~d + seq terms at 2^-24 each (6e-8); bf16 inputs are exact in f32, so the final
// rounding of out to bf16 (<= 2^-8 relative per element, ~2^-9 on average) dominates (1.4e-3).
// lse is never rounded to T.
template <class T> double fwd_tol() { return 1e-6; }
template <> double fwd_tol<double>() { return 1e-12; }
template <> double fwd_tol<bf16>() { return 5e-3; }
// Backward against central differences with eps = 1e-5: f64 sees the O(eps^2) truncation and
// O(1e-16 / eps) cancellation (5e-10); f32 adds its rounding, amplified by the cancellation in
// dS = P * (dout.v - D) (1.6e-7); bf16 also rounds out before D = dout.out is formed, as any bf16
// trainer does, and rounds dq, dk, dv once (2.5e-3).
template <class T> double bwd_tol() { return 2e-6; }
template <> double bwd_tol<double>() { return 1e-8; }
template <> double bwd_tol<bf16>() { return 1e-2; }

TYPED_TEST(AttentionCpu, ForwardMatchesNaive) {
  using T = TypeParam;
  for (const Case& c : kCases) {
    const auto seg = make_segments(c);
    const AttentionParams p = params_of(c, seg);
    const size_t nq = c.batch * c.seq * c.heads * c.d, nkv = c.batch * c.seq * c.kv_heads * c.d;
    auto q = random_vec<T>(nq, 11), k = random_vec<T>(nkv, 12), v = random_vec<T>(nkv, 13);
    std::vector<T> out(nq, from_acc<T>(Acc<T>(NAN)));
    std::vector<Acc<T>> lse(c.batch * c.heads * c.seq, Acc<T>(NAN));
    cpu::attention_forward(p, q.data(), k.data(), v.data(), out.data(), lse.data());
    std::vector<double> ref_lse;
    const auto ref = naive_attention(p, as_double(q), as_double(k), as_double(v), &ref_lse);
    EXPECT_LT(rel_error(out, ref), fwd_tol<T>()) << c.name;
    EXPECT_LT(rel_error(lse, ref_lse), (std::is_same_v<T, double> ? 1e-12 : 1e-5)) << c.name;
  }
}

TYPED_TEST(AttentionCpu, BackwardMatchesFiniteDifferences) {
  using T = TypeParam;
  for (const Case& c : kCases) {
    const auto seg = make_segments(c);
    const AttentionParams p = params_of(c, seg);
    const size_t nq = c.batch * c.seq * c.heads * c.d, nkv = c.batch * c.seq * c.kv_heads * c.d;
    auto q = random_vec<T>(nq, 21), k = random_vec<T>(nkv, 22), v = random_vec<T>(nkv, 23);
    auto dout = random_vec<T>(nq, 24);
    std::vector<T> out(nq);
    std::vector<Acc<T>> lse(c.batch * c.heads * c.seq);
    cpu::attention_forward(p, q.data(), k.data(), v.data(), out.data(), lse.data());
    const T poison = from_acc<T>(Acc<T>(NAN));
    std::vector<T> dq(nq, poison), dk(nkv, poison), dv(nkv, poison);
    cpu::attention_backward(p, q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), dq.data(),
                            dk.data(), dv.data());
    const auto qd = as_double(q), kd = as_double(k), vd = as_double(v), dod = as_double(dout);
    EXPECT_LT(rel_error(dq, finite_diff(p, qd, kd, vd, dod, 0)), bwd_tol<T>()) << c.name << " dq";
    EXPECT_LT(rel_error(dk, finite_diff(p, qd, kd, vd, dod, 1)), bwd_tol<T>()) << c.name << " dk";
    EXPECT_LT(rel_error(dv, finite_diff(p, qd, kd, vd, dod, 2)), bwd_tol<T>()) << c.name << " dv";
  }
}

// Masked keys must not leak: changing k, v of a key outside query i's window and segment leaves
// out_i unchanged bit for bit.
TEST(AttentionCpuMask, MaskedKeysDoNotLeak) {
  const Case c{"leak", 1, 9, 2, 1, 4, 0.f, 0.f, 3, true};
  auto seg = make_segments(c);  // segments 0,0,0,1,1,1,2,2,2
  const AttentionParams p = params_of(c, seg);
  auto q = random_vec<float>(9 * 2 * 4, 31), k = random_vec<float>(9 * 4, 32), v = random_vec<float>(9 * 4, 33);
  std::vector<float> out1(q.size()), out2(q.size()), lse(2 * 9);
  cpu::attention_forward(p, q.data(), k.data(), v.data(), out1.data(), lse.data());
  for (int x = 0; x < 4; ++x) { k[3 * 4 + x] += 5.f; v[3 * 4 + x] -= 7.f; }  // key 3 (segment 1)
  cpu::attention_forward(p, q.data(), k.data(), v.data(), out2.data(), lse.data());
  for (int64_t i = 0; i < 9; ++i)
    for (int64_t x = 0; x < 2 * 4; ++x) {
      const bool sees_key3 = i >= 3 && i < 6;  // same segment, i - 3 < window, 3 <= i
      if (!sees_key3) EXPECT_EQ(out1[i * 8 + x], out2[i * 8 + x]) << "query " << i;
      else EXPECT_NE(out1[i * 8 + x], out2[i * 8 + x]) << "query " << i;
    }
}

// A window no shorter than the sequence hides nothing: effective_window drops it (so that the
// kernels for plain causal attention take it), and the reference gives the same bits with and
// without it; a shorter one stays, and a negative one is left for the checks to refuse.
TEST(AttentionCpuMask, AWindowAsLongAsTheSequenceIsNone) {
  EXPECT_EQ(effective_window(262144, 2048), 0);
  EXPECT_EQ(effective_window(2048, 2048), 0);
  EXPECT_EQ(effective_window(2047, 2048), 2047);
  EXPECT_EQ(effective_window(0, 2048), 0);
  EXPECT_EQ(effective_window(-1, 2048), -1);
  const Case c{"window", 2, 33, 4, 2, 8, 0.f, 0.f, 0, false};
  AttentionParams p = params_of(c, {});
  auto q = random_vec<float>(2 * 33 * 4 * 8, 41), k = random_vec<float>(2 * 33 * 2 * 8, 42);
  auto v = random_vec<float>(k.size(), 43);
  std::vector<float> none(q.size()), windowed(q.size()), lse(2 * 4 * 33);
  cpu::attention_forward(p, q.data(), k.data(), v.data(), none.data(), lse.data());
  p.window = 33;
  cpu::attention_forward(p, q.data(), k.data(), v.data(), windowed.data(), lse.data());
  EXPECT_EQ(none, windowed);
  p.window = 32;  // the last row no longer sees key 0
  cpu::attention_forward(p, q.data(), k.data(), v.data(), windowed.data(), lse.data());
  EXPECT_NE(none, windowed);
}

// A NaN value (key 70, element 3) and an infinite key (key 100, a +inf score for every query) among packed documents that span
// three tiles: every output that sees one is NaN, every other one matches a clean run bit for bit. A
// query that sees key 70 gets a NaN out[3] (and so a NaN D = dout . out and dS); one that sees key 100
// an infinite score (a NaN row, NaN probabilities); dK of a key is NaN when a NaN query row sees it, dV when a query
// row with NaN probabilities does; dV of key 70 itself stays finite (it does not read V).
TEST(AttentionCpuMask, NonFiniteInputsReachExactlyTheOutputsThatSeeThem) {
  const int64_t seq = 150, d = 8;
  std::vector<int32_t> seg(seq);
  for (int64_t i = 0; i < seq; ++i) seg[i] = i < 40 ? 0 : i < 90 ? 1 : 2;
  AttentionParams p;
  p.batch = 1, p.seq = seq, p.heads = 1, p.kv_heads = 1, p.head_dim = d, p.scale = 0.35f, p.segment_ids = seg.data();
  auto q = random_vec<float>(seq * d, 51);
  for (int64_t i = 0; i < seq; ++i) q[i * d + 5] = std::fabs(q[i * d + 5]) + 0.1f;  // q . k_100 = +inf
  const auto dout = random_vec<float>(seq * d, 54);
  const auto k_clean = random_vec<float>(seq * d, 52), v_clean = random_vec<float>(seq * d, 53);
  auto k = k_clean, v = v_clean;
  v[70 * d + 3] = NAN;
  k[100 * d + 5] = INFINITY;
  struct Run {
    std::vector<float> out, lse, dq, dk, dv;
  };
  auto run = [&](const std::vector<float>& kk, const std::vector<float>& vv) {
    Run r{std::vector<float>(seq * d), std::vector<float>(seq), std::vector<float>(seq * d),
          std::vector<float>(seq * d), std::vector<float>(seq * d)};
    cpu::attention_forward(p, q.data(), kk.data(), vv.data(), r.out.data(), r.lse.data());
    cpu::attention_backward(p, q.data(), kk.data(), vv.data(), r.out.data(), dout.data(), r.lse.data(), r.dq.data(),
                            r.dk.data(), r.dv.data());
    return r;
  };
  const Run clean = run(k_clean, v_clean), bad = run(k, v);
  auto sees = [&](int64_t i, int64_t j) { return j <= i && seg[i] == seg[j]; };
  for (int64_t i = 0; i < seq; ++i) {
    const bool nan_row = sees(i, 70) || sees(i, 100), nan_p = sees(i, 100);
    bool nan_dk = false, nan_dv = false;  // key i: seen by a NaN row / a row with NaN probabilities
    for (int64_t r = i; r < seq; ++r)
      if (sees(r, i)) nan_dk |= sees(r, 70) || sees(r, 100), nan_dv |= sees(r, 100);
    EXPECT_EQ(std::isnan(bad.lse[i]), nan_p) << "lse " << i;
    if (!nan_p) {
      EXPECT_EQ(bad.lse[i], clean.lse[i]) << "lse " << i;
    }
    for (int64_t x = 0; x < d; ++x) {
      const int64_t e = i * d + x;
      const std::pair<const std::vector<float>*, const std::vector<float>*> cmp[] = {
          {&bad.out, &clean.out}, {&bad.dq, &clean.dq}, {&bad.dk, &clean.dk}, {&bad.dv, &clean.dv}};
      const bool expect_nan[] = {nan_p || (sees(i, 70) && x == 3), nan_row, nan_dk, nan_dv};
      const char* names[] = {"out", "dq", "dk", "dv"};
      for (int w = 0; w < 4; ++w) {
        const float got = (*cmp[w].first)[e], want = (*cmp[w].second)[e];
        if (expect_nan[w]) {
          EXPECT_TRUE(std::isnan(got)) << names[w] << " row " << i;
        } else {
          EXPECT_EQ(got, want) << names[w] << " row " << i;
        }
      }
    }
  }
}

TEST(AttentionCpuMask, RejectsBadParams) {
  AttentionParams p;
  p.batch = 1; p.seq = 4; p.heads = 3; p.kv_heads = 2; p.head_dim = 8;
  std::vector<float> buf(64), lse(16);
  EXPECT_THROW(cpu::attention_forward(p, buf.data(), buf.data(), buf.data(), buf.data(), lse.data()), Error);
}

// With q's rotation (RopeOfQ) the bf16 backward rotates dq back in f32 and rounds once: every
// element is the f32 backward's (same bf16-valued inputs, the same arithmetic) rounded to bf16, for
// the whole head rotating and for a partial rotation. Rounding dq first and then applying
// rope_backward in bf16 (what the CPU did before) differs in some elements of the same data, so
// this test sees the difference.
TEST(AttentionCpuRope, BackwardRotatesDqBackBeforeItsOneRounding) {
  const int64_t b = 2, s = 70, h = 4, g = 2, d = 16, n_q = b * s * h * d, n_kv = b * s * g * d;
  AttentionParams p;
  p.batch = b; p.seq = s; p.heads = h; p.kv_heads = g; p.head_dim = d;
  p.scale = 1.f / std::sqrt(float(d));
  const auto q = random_vec<bf16>(n_q, 61), k = random_vec<bf16>(n_kv, 62), v = random_vec<bf16>(n_kv, 63);
  const auto dout = random_vec<bf16>(n_q, 64);
  const auto qf = to_float_vec(q), kf = to_float_vec(k), vf = to_float_vec(v), doutf = to_float_vec(dout);
  std::vector<float> outf(n_q), lse(b * h * s);
  cpu::attention_forward(p, qf.data(), kf.data(), vf.data(), outf.data(), lse.data());
  std::vector<bf16> out(n_q);
  for (int64_t i = 0; i < n_q; ++i) out[i] = from_acc<bf16>(outf[i]);
  const std::vector<float> out_rounded = to_float_vec(out);  // both backwards read the same out
  std::vector<int32_t> positions(b * s);
  for (int64_t i = 0; i < b * s; ++i) positions[i] = int32_t(i % s + 11 * (i / s));
  for (const int64_t rotary : {d, int64_t(12)}) {
    SCOPED_TRACE("rotary_dim " + std::to_string(rotary));
    const std::vector<float> inv_freq = cpu::rope_inv_freq(rotary, 10000.0);
    RopeOfQ rope;
    rope.positions = positions.data(), rope.inv_freq = inv_freq.data(), rope.rotary_dim = rotary, rope.mscale = 1.f;
    std::vector<float> dqf(n_q), dkf(n_kv), dvf(n_kv);
    cpu::attention_backward(p, qf.data(), kf.data(), vf.data(), out_rounded.data(), doutf.data(), lse.data(),
                            dqf.data(), dkf.data(), dvf.data(), &rope);
    std::vector<bf16> dq(n_q), dk(n_kv), dv(n_kv);
    cpu::attention_backward(p, q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), dq.data(),
                            dk.data(), dv.data(), &rope);
    int64_t mismatched = 0;
    for (int64_t i = 0; i < n_q; ++i) mismatched += dq[i].bits != from_acc<bf16>(dqf[i]).bits;
    for (int64_t i = 0; i < n_kv; ++i)
      mismatched += dk[i].bits != from_acc<bf16>(dkf[i]).bits || dv[i].bits != from_acc<bf16>(dvf[i]).bits;
    EXPECT_EQ(mismatched, 0);
    // Two roundings: attention's dq in bf16, then rope_backward of it.
    std::vector<bf16> dq_plain(n_q), dk2(n_kv), dv2(n_kv);
    cpu::attention_backward(p, q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), dq_plain.data(),
                            dk2.data(), dv2.data());
    cpu::rope_backward(dq_plain.data(), dq_plain.data(), positions.data(), inv_freq.data(), b * s, h, d, rotary, 1.f);
    int64_t twice_differs = 0;
    for (int64_t i = 0; i < n_q; ++i) twice_differs += dq_plain[i].bits != dq[i].bits;
    EXPECT_GT(twice_differs, 0);
  }
}

}  // namespace
}  // namespace loom::test
