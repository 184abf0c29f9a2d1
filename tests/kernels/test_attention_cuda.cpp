// CUDA attention against the CPU reference: odd sequence lengths, head_dim 32/64/80/96/128/136/192/256
// (and one under a warp), grouped-query heads, sliding windows, soft-capping and segment ids. bf16
// with head_dim % 8 == 0 runs the flash kernels: the longer cases cross many 64-row tiles, end
// inside one, skip tiles by window and by document, and mask inside the diagonal ones. The public
// entry points run the kernel the dispatcher picks; FlashKernels runs every flash kernel by name
// wherever it applies (on an H200: mma.sync, sm90 and the warp-specialised sm90 kernels).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>

#include "kernels/attention.h"
#include "kernels/cuda/flash_attention.cuh"
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
    // Head_dim 256 and the padded widths above 128 (the sm90 backward's 256-wide kernel): batch
    // rows, four query heads per kv head, tails inside a 64-row tile, a window alone, a soft-cap
    // alone, documents.
    {2, 200, 8, 2, 256, 0.f, 0, false}, {2, 129, 4, 1, 256, 0.f, 70, false}, {1, 190, 4, 2, 256, 20.f, 0, false},
    {2, 150, 2, 1, 192, 0.f, 0, true},  {1, 100, 2, 2, 136, 10.f, 50, false},
    // Plain causal at the padded widths (the warp-specialised forward's 256-wide kernel with key
    // tiles of 80: TMA boxes past the row, tails inside a key tile).
    {1, 150, 4, 2, 192, 0.f, 0, false}, {2, 97, 2, 1, 136, 0.f, 0, false},
    // A window at a padded width (the dispatcher's warp-specialised 256-wide backward below 256).
    {1, 300, 4, 2, 192, 0.f, 70, false},
    // Windows wider than a key tile and not a multiple of one (the warp-specialised forward starts
    // each query tile's keys inside the window's first tile), and on the ws backward's boundaries:
    // 130 ends its query tiles one row into a new one, 191 makes a tile's farthest pair exactly one
    // past the window.
    {1, 700, 4, 2, 128, 0.f, 300, false}, {1, 500, 4, 2, 256, 0.f, 200, false},
    {1, 700, 4, 2, 128, 0.f, 130, false}, {1, 700, 4, 2, 64, 0.f, 191, false},
    // Plain causal over many key tiles: the ws backward's blocks then take two tiles each (t and
    // n - 1 - t), K and V loaded again between them; an even and an odd count of 128-key tiles.
    {1, 1000, 4, 2, 128, 0.f, 0, false}, {2, 700, 4, 1, 64, 0.f, 0, false}, {1, 1100, 2, 1, 128, 0.f, 0, false},
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

AttentionParams params_of(const Case& c, const int32_t* seg) {
  AttentionParams p;
  p.batch = c.batch; p.seq = c.seq; p.heads = c.heads; p.kv_heads = c.kv_heads; p.head_dim = c.d;
  p.scale = 2.f / std::sqrt(float(c.d));  // sharper than usual so the softmax is far from uniform
  p.softcap = c.softcap;
  p.window = c.window;
  p.segment_ids = c.segments ? seg : nullptr;
  return p;
}

// fwd(p, q, k, v, out, lse) on the device against cpu::attention_forward; what names the case.
template <class T, class Fwd>
void check_forward(const Case& c, uint32_t seed, const std::string& what, Fwd fwd) {
  const size_t nq = c.batch * c.seq * c.heads * c.d, nkv = c.batch * c.seq * c.kv_heads * c.d;
  const size_t nrows = c.batch * c.heads * c.seq;
  auto q = random_vec<T>(nq, seed + 1), k = random_vec<T>(nkv, seed + 2), v = random_vec<T>(nkv, seed + 3);
  auto seg = make_segments(c);
  AttentionParams p = params_of(c, seg.data());
  std::vector<T> ref(nq);
  std::vector<float> ref_lse(nrows);
  cpu::attention_forward(p, q.data(), k.data(), v.data(), ref.data(), ref_lse.data());

  DeviceBuffer<T> dq_(q), dk_(k), dv_(v), out(poison<T>(nq));
  DeviceBuffer<float> lse(poison<float>(nrows));
  DeviceBuffer<int32_t> dseg(seg);
  p.segment_ids = c.segments ? dseg.get() : nullptr;
  fwd(p, dq_.get(), dk_.get(), dv_.get(), out.get(), lse.get());
  EXPECT_LT(rel_error(out.to_host(), ref), fwd_tol<T>()) << what << name_of(c);
  EXPECT_LT(rel_error(lse.to_host(), ref_lse), 2e-6) << what << name_of(c);  // f32 on both sides
}

// bwd(p, q, k, v, out, dout, lse, dq, dk, dv, workspace) on the device against
// cpu::attention_backward; both differentiate the same CPU forward (out, lse).
template <class T, class Bwd>
void check_backward(const Case& c, uint32_t seed, const std::string& what, Bwd bwd) {
  const size_t nq = c.batch * c.seq * c.heads * c.d, nkv = c.batch * c.seq * c.kv_heads * c.d;
  const size_t nrows = c.batch * c.heads * c.seq;
  auto q = random_vec<T>(nq, seed + 1), k = random_vec<T>(nkv, seed + 2), v = random_vec<T>(nkv, seed + 3);
  auto dout = random_vec<T>(nq, seed + 4);
  auto seg = make_segments(c);
  AttentionParams p = params_of(c, seg.data());
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
  bwd(p, d_q.get(), d_k.get(), d_v.get(), d_out.get(), d_dout.get(), d_lse.get(), dq.get(), dk.get(), dv.get(),
      ws.get());
  EXPECT_LT(rel_error(dv.to_host(), ref_dv), bwd_tol<T>()) << what << name_of(c) << " dv";
  if (c.seq > 1) {
    EXPECT_LT(rel_error(dq.to_host(), ref_dq), bwd_tol<T>()) << what << name_of(c) << " dq";
    EXPECT_LT(rel_error(dk.to_host(), ref_dk), bwd_tol<T>()) << what << name_of(c) << " dk";
    return;
  }
  // One position: P = 1 and out = v, so dP = D and dS = P (dP - D) = 0, and the exact dq and dk are 0.
  // Kernel and reference each hold only the rounding of that cancellation (the CPU reference takes dP
  // from a GEMM and D from a dot product, ~1e-7 of the terms), so a relative error between them is
  // noise over noise: both must instead be 0 to within the tolerance of the terms that cancel,
  // scale |dout . v| |k| for dq and scale |dout . v| |q| for dk.
  const std::vector<double> q64 = to_f64(q), k64 = to_f64(k), v64 = to_f64(v), do64 = to_f64(dout);
  double terms_q = 0, terms_k = 0;
  for (int64_t h = 0; h < c.heads; ++h) {
    const int64_t g = h / (c.heads / c.kv_heads);
    double dp = 0, kk = 0, qq = 0;
    for (int64_t x = 0; x < c.d; ++x) {
      dp += do64[h * c.d + x] * v64[g * c.d + x];
      kk += k64[g * c.d + x] * k64[g * c.d + x];
      qq += q64[h * c.d + x] * q64[h * c.d + x];
    }
    terms_q += double(p.scale) * double(p.scale) * dp * dp * kk;
    terms_k += double(p.scale) * double(p.scale) * dp * dp * qq;
  }
  // ||x||, +inf when x holds a NaN.
  const auto l2 = [](const std::vector<T>& x) {
    double n = 0;
    for (const T& e : x) n += double(to_acc(e)) * double(to_acc(e));
    return std::isnan(n) ? INFINITY : std::sqrt(n);
  };
  ASSERT_GT(terms_q, 0.0);
  ASSERT_GT(terms_k, 0.0);
  const double tol_q = bwd_tol<T>() * std::sqrt(terms_q), tol_k = bwd_tol<T>() * std::sqrt(terms_k);
  EXPECT_LT(l2(ref_dq), tol_q) << what << name_of(c) << " reference dq";
  EXPECT_LT(l2(dq.to_host()), tol_q) << what << name_of(c) << " dq";
  EXPECT_LT(l2(ref_dk), tol_k) << what << name_of(c) << " reference dk";
  EXPECT_LT(l2(dk.to_host()), tol_k) << what << name_of(c) << " dk";
}

TYPED_TEST(AttentionCuda, ForwardMatchesCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  uint32_t seed = 100;
  for (const Case& c : kCases) {
    check_forward<T>(c, seed += 4, "", [](const AttentionParams& p, const T* q, const T* k, const T* v, T* out,
                                          float* lse) { cuda::attention_forward(p, q, k, v, out, lse, nullptr); });
  }
}

TYPED_TEST(AttentionCuda, BackwardMatchesCpu) {
  LOOM_REQUIRE_GPU();
  using T = TypeParam;
  uint32_t seed = 200;
  for (const Case& c : kCases) {
    check_backward<T>(c, seed += 4, "",
                      [](const AttentionParams& p, const T* q, const T* k, const T* v, const T* out, const T* dout,
                         const float* lse, T* dq, T* dk, T* dv, void* ws) {
                        cuda::attention_backward(p, q, k, v, out, dout, lse, dq, dk, dv, ws, nullptr);
                      });
  }
}

// Every flash kernel by name on every case it applies to (bf16, head_dim % 8 == 0): the ones the
// dispatcher does not pick on this GPU are still the path elsewhere (mma.sync off sm_90a) or for
// other shapes, and bench/ compares them. (These cases have fewer query tiles than an H200 has SMs,
// so sm90_ws_persistent runs a tile a block here: WarpSpecialisedForwardWalksTiles walks them.)
TEST(FlashKernels, EachMatchesCpu) {
  LOOM_REQUIRE_GPU();
  using cuda::flash::Kernel;
  for (Kernel kernel : {Kernel::kMma, Kernel::kSm90, Kernel::kSm90Ws, Kernel::kSm90WsPersistent}) {
    const std::string what = std::string("kernel ") + cuda::flash::kernel_name(kernel) + ": ";
    int forwards = 0, backwards = 0;
    uint32_t seed = 300;
    for (const Case& c : kCases) {
      seed += 4;
      if (c.d % 8 != 0) continue;
      static const int32_t kSomeSegments = 0;  // runs() only asks whether there are segments
      const AttentionParams ps = params_of(c, &kSomeSegments);
      if (cuda::flash::runs(kernel, ps, false)) {
        ++forwards;
        check_forward<bf16>(c, seed, what, [&](const AttentionParams& pp, const bf16* q, const bf16* k, const bf16* v,
                                               bf16* out, float* lse) { cuda::flash::forward(pp, q, k, v, out, lse, nullptr, kernel); });
      }
      if (cuda::flash::runs(kernel, ps, true)) {
        ++backwards;
        check_backward<bf16>(c, seed, what,
                             [&](const AttentionParams& pp, const bf16* q, const bf16* k, const bf16* v, const bf16* out,
                                 const bf16* dout, const float* lse, bf16* dq, bf16* dk, bf16* dv, void* ws) {
                               cuda::flash::backward(pp, q, k, v, out, dout, lse, dq, dk, dv, ws, nullptr, kernel);
                             });
      }
    }
    std::printf("flash kernel %s: %d forward and %d backward cases\n", cuda::flash::kernel_name(kernel), forwards, backwards);
    if (kernel == Kernel::kMma) {
      EXPECT_GT(backwards, 0);  // runs on every GPU
    }
  }
}

// The warp-specialised forward with fewer blocks than query tiles, so that each block walks many
// (the persistent launch has one block per SM; these cases have fewer tiles than an H200 has SMs):
// the key-tile ring and Q's barriers run on across tiles of different lengths (and, with a window,
// different first key tiles), and the two consumers' turns alternate across them. Block counts
// that divide the tiles and that do not. Head dims below each kernel's width (96 and 136, 192) make
// the O stores leave out columns (the TMA stores of head_dim 64 and 128, the register stores of the
// 256-wide kernel), rows past seq are left out, in every item a block takes, the two Q buffers
// (head_dim 64 and 128) alternate, and the 256-wide kernel's one Q buffer is loaded while the last
// item's softmax and P V still run. Both orders of taking tiles: round robin, and from
// the stream's counter (dynamic: its reset between launches is checked by every launch after the first).
TEST(FlashKernels, WarpSpecialisedForwardWalksTiles) {
  LOOM_REQUIRE_GPU();
  if (!cuda::flash::sm90_ready()) GTEST_SKIP() << "no sm_90a";
  // A kv head per query head in half of them: consecutive items then read different keys, so a
  // stage read before its new tile landed would show (with shared kv heads it can hold the same
  // bytes). Windows whose first key tile moves along the rows, at both widths.
  const Case cases[] = {{2, 400, 4, 2, 128, 0.f, 0, false},   {2, 400, 4, 4, 128, 0.f, 0, false},
                        {1, 333, 8, 8, 64, 0.f, 0, false},    {1, 300, 4, 2, 256, 0.f, 0, false},
                        {2, 97, 2, 2, 136, 0.f, 0, false},    {1, 700, 4, 2, 128, 0.f, 300, false},
                        {1, 500, 4, 4, 256, 0.f, 200, false}, {2, 129, 4, 1, 256, 0.f, 70, false},
                        {2, 300, 4, 2, 96, 0.f, 0, false},    {1, 250, 2, 2, 192, 0.f, 0, false}};
  using cuda::flash::TileOrder;
  uint32_t seed = 700;
  for (const Case& c : cases) {
    for (TileOrder order : {TileOrder::kRoundRobin, TileOrder::kDynamic}) {
      for (int64_t blocks : {1, 3, 7, 1}) {  // twice on one block: a race need not show the first time
        seed += 4;
        const std::string what = std::string("sm90_ws over ") + std::to_string(blocks) + " blocks, " +
                                 (order == TileOrder::kDynamic ? "dynamic" : "round robin") + ": ";
        check_forward<bf16>(c, seed, what,
                            [&](const AttentionParams& pp, const bf16* q, const bf16* k, const bf16* v, bf16* out,
                                float* lse) { cuda::flash::forward_sm90_ws(pp, q, k, v, out, lse, nullptr, blocks, order); });
      }
    }
  }
}

// A persistent forward's blocks take items from counters kept per stream: two launches queued on two
// streams at once each compute every item (counters shared between them would hand some of one
// launch's items to the other's blocks, and the other launch would skip them). The second stream's
// output must equal the checked one's bit for bit (an item's arithmetic does not depend on the block
// that takes it).
TEST(FlashKernels, PersistentForwardOnTwoStreams) {
  LOOM_REQUIRE_GPU();
  if (!cuda::flash::sm90_ready()) GTEST_SKIP() << "no sm_90a";
  const Case cases[] = {{2, 1000, 8, 2, 128, 0.f, 0, false}, {1, 900, 8, 4, 64, 0.f, 0, false},
                        {1, 700, 4, 2, 256, 0.f, 0, false}};
  cudaStream_t s1 = nullptr, s2 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  uint32_t seed = 900;
  for (const Case& c : cases) {
    for (int64_t blocks : {2, 5}) {
      seed += 4;
      const size_t nq = c.batch * c.seq * c.heads * c.d, nrows = c.batch * c.heads * c.seq;
      DeviceBuffer<bf16> out2(nq);
      DeviceBuffer<float> lse2(nrows);
      check_forward<bf16>(c, seed, "sm90_ws persistent on two streams over " + std::to_string(blocks) + " blocks: ",
                          [&](const AttentionParams& pp, const bf16* q, const bf16* k, const bf16* v, bf16* out,
                              float* lse) {
                            for (int rep = 0; rep < 3; ++rep) {  // the counters reset between a stream's launches
                              cuda::flash::forward_sm90_ws(pp, q, k, v, out2.get(), lse2.get(), s1, blocks,
                                                           cuda::flash::TileOrder::kDynamic);
                              cuda::flash::forward_sm90_ws(pp, q, k, v, out, lse, s2, blocks,
                                                           cuda::flash::TileOrder::kDynamic);
                            }
                            ASSERT_EQ(cudaStreamSynchronize(s1), cudaSuccess);
                            ASSERT_EQ(cudaStreamSynchronize(s2), cudaSuccess);
                            std::vector<bf16> a(nq);
                            ASSERT_EQ(cudaMemcpy(a.data(), out, nq * sizeof(bf16), cudaMemcpyDeviceToHost), cudaSuccess);
                            const std::vector<bf16> b = out2.to_host();
                            EXPECT_EQ(std::memcmp(a.data(), b.data(), nq * sizeof(bf16)), 0) << name_of(c);
                          });
    }
  }
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

// What the dispatcher picks: on sm_90a the warp-specialised kernels for causal attention (with or
// without a window) at head_dim 64..256, the sm90 kernels for the rest (soft-capping, segments,
// narrower heads); mma.sync elsewhere.
TEST(FlashKernels, DispatchByArchitectureAndShape) {
  LOOM_REQUIRE_GPU();
  using cuda::flash::Kernel;
  auto params = [](int64_t d, float softcap, int64_t window) {
    AttentionParams p;
    p.batch = 1; p.seq = 100; p.heads = 4; p.kv_heads = 2; p.head_dim = d;
    p.scale = 0.1f; p.softcap = softcap; p.window = window;
    return p;
  };
  const bool hopper = cuda::flash::sm90_ready();
  const Kernel ws = hopper ? Kernel::kSm90Ws : Kernel::kMma, sm90 = hopper ? Kernel::kSm90 : Kernel::kMma;
  const Kernel persistent = hopper ? Kernel::kSm90WsPersistent : Kernel::kMma;
  // Forward: warp-specialised at head_dim 64..256, persistent for plain causal, a block per tile
  // with a window; sm90 for soft-capping and narrower heads.
  EXPECT_EQ(cuda::flash::forward_kernel(params(128, 0.f, 0)), persistent);
  EXPECT_EQ(cuda::flash::forward_kernel(params(64, 0.f, 0)), persistent);
  EXPECT_EQ(cuda::flash::forward_kernel(params(256, 0.f, 0)), persistent);
  EXPECT_EQ(cuda::flash::forward_kernel(params(128, 0.f, 30)), ws);
  EXPECT_EQ(cuda::flash::forward_kernel(params(256, 0.f, 30)), ws);
  EXPECT_EQ(cuda::flash::forward_kernel(params(128, 20.f, 0)), sm90);
  EXPECT_EQ(cuda::flash::forward_kernel(params(32, 0.f, 0)), sm90);
  // Backward: warp-specialised at head_dim 64..256 with or without a window; sm90 otherwise.
  EXPECT_EQ(cuda::flash::backward_kernel(params(128, 0.f, 0)), ws);
  EXPECT_EQ(cuda::flash::backward_kernel(params(128, 0.f, 30)), ws);
  EXPECT_EQ(cuda::flash::backward_kernel(params(96, 20.f, 0)), sm90);
  EXPECT_EQ(cuda::flash::backward_kernel(params(32, 0.f, 0)), sm90);
  EXPECT_EQ(cuda::flash::backward_kernel(params(256, 0.f, 0)), ws);
  EXPECT_EQ(cuda::flash::backward_kernel(params(256, 0.f, 30)), ws);
  EXPECT_EQ(cuda::flash::backward_kernel(params(192, 30.f, 40)), sm90);
}

// A process that runs the flash kernels on a second GPU after the first (a --device-map over two
// GPUs): their shared-memory allowance (over 48 KB) is set per device, so they must launch there too.
TEST(FlashKernels, RunOnASecondDevice) {
  LOOM_REQUIRE_GPU();
  using cuda::flash::Kernel;
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices < 2) GTEST_SKIP() << "one GPU";
  struct Restore {  // the current device again however the test ends
    int device = 0;
    Restore() { cudaGetDevice(&device); }
    ~Restore() { cudaSetDevice(device); }
  } restore;
  // Every kernel by name, at both head-dim widths of each (the 256-wide ones are other kernels).
  const Case cases[] = {{2, 200, 4, 2, 128, 0.f, 0, false}, {1, 130, 4, 2, 256, 0.f, 0, false}};
  for (int dev : {0, 1}) {
    ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
    for (Kernel kernel : {Kernel::kMma, Kernel::kSm90, Kernel::kSm90Ws, Kernel::kSm90WsPersistent})
      for (const Case& c : cases) {
        const AttentionParams ps = params_of(c, nullptr);
        const std::string what = "device " + std::to_string(dev) + " kernel " + cuda::flash::kernel_name(kernel) + ": ";
        if (cuda::flash::runs(kernel, ps, false))
          check_forward<bf16>(c, 900, what, [&](const AttentionParams& pp, const bf16* q, const bf16* k, const bf16* v,
                                                bf16* out, float* lse) {
            cuda::flash::forward(pp, q, k, v, out, lse, nullptr, kernel);
          });
        if (cuda::flash::runs(kernel, ps, true))
          check_backward<bf16>(c, 900, what,
                               [&](const AttentionParams& pp, const bf16* q, const bf16* k, const bf16* v, const bf16* out,
                                   const bf16* dout, const float* lse, bf16* dq, bf16* dk, bf16* dv, void* ws) {
                                 cuda::flash::backward(pp, q, k, v, out, dout, lse, dq, dk, dv, ws, nullptr, kernel);
                               });
      }
  }
}

TEST(AttentionCudaChecks, RejectsHeadDimOver256) {
  AttentionParams p;
  p.batch = 1; p.seq = 1; p.heads = 1; p.kv_heads = 1; p.head_dim = 320;
  EXPECT_THROW(cuda::attention_forward<float>(p, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace loom::test
