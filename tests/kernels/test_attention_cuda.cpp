// CUDA attention against the CPU reference: odd sequence lengths, head_dim 32/64/80/96/128/256 (and
// one under a warp), grouped-query heads, sliding windows, soft-capping and segment ids. bf16 with
// head_dim % 8 == 0 runs the flash kernels: the longer cases cross many 64-row tiles, end inside
// one, skip tiles by window and by document, and mask inside the diagonal ones.
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "kernels/attention.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

struct Case {
  int64_t batch, seq, heads, kv_heads, d;
  float softcap;
  int64_t window;
  bool segments;
};

const Case kCases[] = {
    {1, 1, 2, 1, 64, 0.f, 0, false},    {2, 7, 4, 4, 64, 0.f, 0, false},   {1, 33, 4, 2, 80, 0.f, 0, false},
    {2, 130, 4, 1, 128, 0.f, 0, false}, {1, 33, 2, 2, 256, 0.f, 0, false}, {1, 130, 8, 2, 64, 0.f, 17, false},
    {2, 33, 4, 2, 80, 50.f, 0, false},  {2, 130, 2, 1, 128, 0.f, 0, true}, {1, 130, 6, 3, 256, 30.f, 40, true},
    {3, 7, 2, 1, 20, 5.f, 3, true},
    // Many tiles: tails that do not fill one, windows wider and narrower than a tile, long
    // documents (whole tiles skipped or fully visible), four query heads per kv head.
    {1, 333, 8, 2, 128, 0.f, 0, false}, {2, 200, 4, 1, 64, 0.f, 0, false},  {1, 300, 4, 2, 256, 0.f, 0, false},
    {1, 333, 4, 1, 128, 0.f, 100, false}, {1, 257, 2, 2, 64, 0.f, 30, false}, {2, 400, 4, 2, 128, 0.f, 0, true},
    {1, 300, 4, 4, 256, 30.f, 0, true},  {1, 513, 8, 2, 96, 20.f, 150, true},
    // Plain causal at head_dim 32 (below the warp-specialised kernels' 64-column box: variant 3)
    // and 96 (their second box half past the row).
    {1, 70, 4, 2, 32, 0.f, 0, false},    {1, 130, 4, 2, 96, 0.f, 0, false},
};

std::string name_of(const Case& c) {
  std::ostringstream os;
  os << "b" << c.batch << " s" << c.seq << " h" << c.heads << "/" << c.kv_heads << " d" << c.d << " cap" << c.softcap
     << " w" << c.window << (c.segments ? " seg" : "");
  return os.str();
}

// Packed documents of uneven lengths, different in each batch row: 5, 12, 19, ... tokens for short
// sequences; 37, 114, 191, ... past 150 tokens, so that whole tiles fall inside one document.
std::vector<int32_t> make_segments(const Case& c) {
  std::vector<int32_t> s(c.batch * c.seq);
  const int64_t base = c.seq > 150 ? 37 : 5, step = c.seq > 150 ? 77 : 7;
  for (int64_t b = 0; b < c.batch; ++b) {
    int32_t id = 0;
    int64_t left = base + b;
    for (int64_t i = 0; i < c.seq; ++i) {
      if (left-- == 0) { ++id; left = base + step * id + b - 1; }
      s[b * c.seq + i] = id;
    }
  }
  return s;
}

// Outputs start as NaN, so an element the kernel never writes fails the comparison.
template <class T>
std::vector<T> poison(size_t n) {
  return std::vector<T>(n, from_acc<T>(std::numeric_limits<float>::quiet_NaN()));
}

template <class T>
class AttentionCuda : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(AttentionCuda, Types);

// Relative L2 tolerances. f32: the GPU and CPU differ only in summation order and in expf/tanhf
// versus std::exp/std::tanh (a few ulp), ~1e-6; the backward's dS = P * (dout.v - D) cancels, so
// allow 1e-5. bf16: inputs are exact in f32 on both sides; the CPU rounds only each output (2^-9
// relative on average, 2^-8 at most), while the flash kernels also feed P and dS to the tensor cores
// as bf16 (as FlashAttention does), each rounding a relative 2^-9 that averages down over a row's
// keys: a few 1e-3 in all, under tol<bf16>() = 8e-3 (a wrong mask or tile is off by far more).
template <class T> double fwd_tol() { return 2e-6; }
template <> double fwd_tol<bf16>() { return tol<bf16>(); }
template <class T> double bwd_tol() { return 1e-5; }
template <> double bwd_tol<bf16>() { return tol<bf16>(); }

TYPED_TEST(AttentionCuda, ForwardMatchesCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  uint32_t seed = 100;
  for (const Case& c : kCases) {
    const size_t nq = c.batch * c.seq * c.heads * c.d, nkv = c.batch * c.seq * c.kv_heads * c.d;
    const size_t nrows = c.batch * c.heads * c.seq;
    auto q = random_vec<T>(nq, ++seed), k = random_vec<T>(nkv, ++seed), v = random_vec<T>(nkv, ++seed);
    auto seg = make_segments(c);
    AttentionParams p;
    p.batch = c.batch; p.seq = c.seq; p.heads = c.heads; p.kv_heads = c.kv_heads; p.head_dim = c.d;
    p.scale = 2.f / std::sqrt(float(c.d));  // sharper than usual so the softmax is far from uniform
    p.softcap = c.softcap;
    p.window = c.window;
    p.segment_ids = c.segments ? seg.data() : nullptr;
    std::vector<T> ref(nq);
    std::vector<float> ref_lse(nrows);
    cpu::attention_forward(p, q.data(), k.data(), v.data(), ref.data(), ref_lse.data());

    DeviceBuffer<T> dq_(q), dk_(k), dv_(v), out(poison<T>(nq));
    DeviceBuffer<float> lse(poison<float>(nrows));
    DeviceBuffer<int32_t> dseg(seg);
    p.segment_ids = c.segments ? dseg.get() : nullptr;
    cuda::attention_forward(p, dq_.get(), dk_.get(), dv_.get(), out.get(), lse.get(), nullptr);
    EXPECT_LT(rel_error(out.to_host(), ref), fwd_tol<T>()) << name_of(c);
    EXPECT_LT(rel_error(lse.to_host(), ref_lse), 2e-6) << name_of(c);  // f32 on both sides
  }
}

TYPED_TEST(AttentionCuda, BackwardMatchesCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  uint32_t seed = 200;
  for (const Case& c : kCases) {
    const size_t nq = c.batch * c.seq * c.heads * c.d, nkv = c.batch * c.seq * c.kv_heads * c.d;
    const size_t nrows = c.batch * c.heads * c.seq;
    auto q = random_vec<T>(nq, ++seed), k = random_vec<T>(nkv, ++seed), v = random_vec<T>(nkv, ++seed);
    auto dout = random_vec<T>(nq, ++seed);
    auto seg = make_segments(c);
    AttentionParams p;
    p.batch = c.batch; p.seq = c.seq; p.heads = c.heads; p.kv_heads = c.kv_heads; p.head_dim = c.d;
    p.scale = 2.f / std::sqrt(float(c.d));
    p.softcap = c.softcap;
    p.window = c.window;
    p.segment_ids = c.segments ? seg.data() : nullptr;
    // Both backends differentiate the same CPU forward (out, lse), so only the backward is compared.
    std::vector<T> out(nq), ref_dq(nq), ref_dk(nkv), ref_dv(nkv);
    std::vector<float> lse(nrows);
    cpu::attention_forward(p, q.data(), k.data(), v.data(), out.data(), lse.data());
    cpu::attention_backward(p, q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), ref_dq.data(),
                            ref_dk.data(), ref_dv.data());

    DeviceBuffer<T> d_q(q), d_k(k), d_v(v), d_out(out), d_dout(dout), dq(poison<T>(nq)), dk(poison<T>(nkv)),
        dv(poison<T>(nkv));
    DeviceBuffer<float> d_lse(lse);
    DeviceBuffer<int32_t> dseg(seg);
    p.segment_ids = c.segments ? dseg.get() : nullptr;
    DeviceBuffer<unsigned char> ws(cuda::attention_backward_workspace_bytes(p));
    cuda::attention_backward(p, d_q.get(), d_k.get(), d_v.get(), d_out.get(), d_dout.get(), d_lse.get(), dq.get(),
                             dk.get(), dv.get(), ws.get(), nullptr);
    EXPECT_LT(rel_error(dq.to_host(), ref_dq), bwd_tol<T>()) << name_of(c) << " dq";
    EXPECT_LT(rel_error(dk.to_host(), ref_dk), bwd_tol<T>()) << name_of(c) << " dk";
    EXPECT_LT(rel_error(dv.to_host(), ref_dv), bwd_tol<T>()) << name_of(c) << " dv";
  }
}

TEST(AttentionCudaChecks, RejectsHeadDimOver256) {
  AttentionParams p;
  p.batch = 1; p.seq = 1; p.heads = 1; p.kv_heads = 1; p.head_dim = 320;
  EXPECT_THROW(cuda::attention_forward<float>(p, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace loom::test
