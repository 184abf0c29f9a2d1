// A NaN score or logit must give NaN on the GPU as on the CPU (test_nan_propagation_cpu.cpp):
// attention forward on every path (the warp-per-row kernel for f32 and odd head dims, the flash
// kernels for bf16: the warp-specialised sm90 kernel for plain causal head_dim 64-128, the sm90
// kernel with a window or at head_dim 256, and each flash kernel by name), backward, decode,
// cross-entropy, the fused lm_head loss and RMSNorm. fmaxf drops NaN; the kernels use nan_fmaxf or carry
// the NaN in the sum and must not turn a NaN sum into 0.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_decode.h"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cross_entropy.h"
#include "kernels/linear_cross_entropy.h"
#include "kernels/norm.h"
#include "tests/kernels/cublaslt_test.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {
namespace {

template <class T>
T nan_of() {
  return from_acc<T>(std::numeric_limits<float>::quiet_NaN());
}

template <class T>
bool is_nan(T x) {
  return std::isnan(to_acc(x));
}

struct AttnCase {
  int64_t seq, d, window;
  int64_t bad_key;
};

// Keys of one head at `bad_key` hold a NaN: rows i >= bad_key (inside the window) are NaN in out and
// lse, the earlier ones finite. Then the backward: the NaN reaches dq of the row at the key.
// kernel: a flash kernel by name (bf16), or kAuto for the public entry points.
template <class T>
void check_attention(const AttnCase& c, cuda::flash::Kernel kernel = cuda::flash::Kernel::kAuto,
                     cuda::flash::Kernel bwd_kernel = cuda::flash::Kernel::kAuto) {
  SCOPED_TRACE(testing::Message() << "seq " << c.seq << " d " << c.d << " window " << c.window << " bad key "
                                  << c.bad_key << " kernel " << cuda::flash::kernel_name(kernel));
  AttentionParams p;
  p.batch = 1, p.seq = c.seq, p.heads = 2, p.kv_heads = 1, p.head_dim = c.d, p.window = c.window;
  p.scale = 1.f / std::sqrt(float(c.d));
  const auto q = random_vec<T>(c.seq * 2 * c.d, 1), v = random_vec<T>(c.seq * c.d, 3), dout = random_vec<T>(c.seq * 2 * c.d, 4);
  auto k = random_vec<T>(c.seq * c.d, 2);
  k[c.bad_key * c.d + c.d / 2] = nan_of<T>();
  DeviceBuffer<T> dq_in(q), dk_in(k), dv_in(v), ddout(dout), out(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
  DeviceBuffer<float> lse(c.seq * 2);
  if constexpr (std::is_same_v<T, bf16>) {
    if (kernel != cuda::flash::Kernel::kAuto) cuda::flash::forward(p, dq_in.get(), dk_in.get(), dv_in.get(), out.get(), lse.get(), nullptr, kernel);
  }
  if (kernel == cuda::flash::Kernel::kAuto) cuda::attention_forward(p, dq_in.get(), dk_in.get(), dv_in.get(), out.get(), lse.get(), nullptr);
  const std::vector<T> o = out.to_host();
  const std::vector<float> l = lse.to_host();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < c.seq; ++i) {
      const bool sees = i >= c.bad_key && (c.window == 0 || i - c.bad_key < c.window);
      const T x = o[(i * 2 + h) * c.d];
      EXPECT_EQ(is_nan(x), sees) << "head " << h << " row " << i << " out " << to_acc(x);
      EXPECT_EQ(std::isnan(l[h * c.seq + i]), sees) << "head " << h << " row " << i << " lse " << l[h * c.seq + i];
    }
  DeviceBuffer<unsigned char> ws(cuda::attention_backward_workspace_bytes(p));
  if constexpr (std::is_same_v<T, bf16>) {
    if (kernel != cuda::flash::Kernel::kAuto)
      cuda::flash::backward(p, dq_in.get(), dk_in.get(), dv_in.get(), out.get(), ddout.get(), lse.get(), dq.get(), dk.get(),
                      dv.get(), ws.get(), nullptr, bwd_kernel);
  }
  if (kernel == cuda::flash::Kernel::kAuto)
    cuda::attention_backward(p, dq_in.get(), dk_in.get(), dv_in.get(), out.get(), ddout.get(), lse.get(), dq.get(),
                             dk.get(), dv.get(), ws.get(), nullptr);
  const std::vector<T> g = dq.to_host();
  // (Rows that do not see the key may get NaN too: the flash kernels multiply a masked 0 by the
  // NaN key in dS K, as PyTorch's math path does.)
  EXPECT_TRUE(is_nan(g[(c.bad_key * 2) * c.d])) << "dq of the row at the bad key";
}

// f32: the warp-per-row kernel.
TEST(NanPropagationCuda, AttentionF32) {
  LOOM_REQUIRE_GPU();
  for (const AttnCase& c : {AttnCase{9, 64, 0, 0}, AttnCase{9, 64, 0, 4}, AttnCase{70, 20, 0, 33}})
    check_attention<float>(c);
}

// bf16 head_dim 20: the warp kernel; 64 and 128 plain causal: the flash kernels (warp-specialised
// on sm_90a); a window or head_dim 256: the sm90 kernels. Bad keys at the first key, inside and at
// the end of a tile.
const AttnCase kBf16Cases[] = {AttnCase{70, 20, 0, 5},     AttnCase{200, 64, 0, 0},    AttnCase{200, 64, 0, 130},
                               AttnCase{333, 128, 0, 127}, AttnCase{200, 128, 40, 100}, AttnCase{130, 256, 0, 64},
                               AttnCase{200, 256, 40, 100}};

TEST(NanPropagationCuda, AttentionBf16Flash) {
  LOOM_REQUIRE_GPU();
  for (const AttnCase& c : kBf16Cases) check_attention<bf16>(c);
}

// Each flash kernel by name where it applies (on sm_90a the dispatcher never picks mma.sync); a
// kernel that runs only the forward of a case is checked with the dispatcher's backward.
TEST(NanPropagationCuda, AttentionBf16EachFlashKernel) {
  LOOM_REQUIRE_GPU();
  using cuda::flash::Kernel;
  for (Kernel kernel : {Kernel::kMma, Kernel::kSm90, Kernel::kSm90Ws, Kernel::kSm90WsPersistent})
    for (const AttnCase& c : kBf16Cases) {
      AttentionParams p;
      p.batch = 1, p.seq = c.seq, p.heads = 2, p.kv_heads = 1, p.head_dim = c.d, p.window = c.window;
      if (c.d % 8 != 0 || !cuda::flash::runs(kernel, p, false)) continue;
      check_attention<bf16>(c, kernel, cuda::flash::runs(kernel, p, true) ? kernel : Kernel::kAuto);
    }
}

TEST(NanPropagationCuda, AttentionDecode) {
  LOOM_REQUIRE_GPU();
  DecodeParams p;
  p.batch = 1, p.heads = 2, p.kv_heads = 1, p.head_dim = 64, p.capacity = 16, p.length = 9, p.scale = 0.125f;
  for (int64_t bad : {0, 5}) {
    const auto q = random_vec<float>(2 * 64, 5), v = random_vec<float>(16 * 64, 7);
    auto k = random_vec<float>(16 * 64, 6);
    k[bad * 64 + 3] = nan_of<float>();
    DeviceBuffer<float> dq(q), dk(k), dv(v), out(2 * 64);
    cuda::attention_decode(p, dq.get(), dk.get(), dv.get(), out.get(), nullptr);
    for (float x : out.to_host()) EXPECT_TRUE(std::isnan(x)) << "key " << bad;
  }
}

// One NaN logit in row 1 (the first logit, one in the middle of a 4-wide tile, the last): lse and
// loss of row 1 are NaN, the other rows finite. vocab 5000: several tiles per thread.
TEST(NanPropagationCuda, CrossEntropy) {
  LOOM_REQUIRE_GPU();
  const int64_t n = 3, vocab = 5000;
  for (int64_t bad : {int64_t{0}, int64_t{2501}, vocab - 1}) {
    auto logits = random_vec<bf16>(n * vocab, 8);
    logits[vocab + bad] = nan_of<bf16>();
    DeviceBuffer<bf16> d(logits);
    DeviceBuffer<int32_t> t(std::vector<int32_t>{1, 2, 3});
    DeviceBuffer<float> loss(n), lse(n);
    cuda::cross_entropy_forward(d.get(), t.get(), loss.get(), lse.get(), n, vocab, 0.f, kIgnoreIndex, nullptr);
    const std::vector<float> l = loss.to_host(), s = lse.to_host();
    EXPECT_TRUE(std::isnan(l[1]) && std::isnan(s[1])) << "logit " << bad << ": loss " << l[1] << " lse " << s[1];
    EXPECT_TRUE(std::isfinite(l[0]) && std::isfinite(l[2])) << "logit " << bad;
  }
}

// Only NaN and -inf logits in a row: the NaN sits in a lane whose maximum is -inf, where a merge
// that returned early would drop it.
TEST(NanPropagationCuda, CrossEntropyNanAmongMinusInf) {
  LOOM_REQUIRE_GPU();
  const int64_t vocab = 1024;
  std::vector<float> logits(vocab, -INFINITY);
  logits[700] = nan_of<float>();
  DeviceBuffer<float> d(logits), loss(1), lse(1);
  DeviceBuffer<int32_t> t(std::vector<int32_t>{3});
  cuda::cross_entropy_forward(d.get(), t.get(), loss.get(), lse.get(), 1, vocab, 0.f, kIgnoreIndex, nullptr);
  EXPECT_TRUE(std::isnan(lse.to_host()[0]));
}

// RMSNorm: a NaN in a row makes that row NaN (its sum of squares), the other rows stay finite.
TEST(NanPropagationCuda, RmsNorm) {
  LOOM_REQUIRE_GPU();
  const int64_t rows = 3, cols = 1000;
  auto x = random_vec<bf16>(rows * cols, 11);
  x[cols + 777] = nan_of<bf16>();
  const auto w = random_vec<bf16>(cols, 12);
  DeviceBuffer<bf16> dx(x), dw(w), y(rows * cols);
  DeviceBuffer<float> rstd(rows);
  cuda::rms_norm_forward(dx.get(), dw.get(), y.get(), rstd.get(), rows, cols, 1e-6f, false, nullptr);
  const std::vector<bf16> out = y.to_host();
  EXPECT_TRUE(is_nan(out[cols]) && is_nan(out[2 * cols - 1]));
  EXPECT_FALSE(is_nan(out[0]) || is_nan(out[2 * cols]));
}

class NanPropagationLce : public CublasLtTest {};

// A NaN in one vocabulary row of the head (the first, a later one): the mean loss and dh are NaN.
TEST_F(NanPropagationLce, LinearCrossEntropy) {
  const int64_t n = 40, vocab = 300, hidden = 32;
  const auto h = random_vec<bf16>(n * hidden, 9);
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 7) % vocab);
  for (int64_t bad : {int64_t{0}, int64_t{211}}) {
    auto w = random_vec<bf16>(vocab * hidden, 10);
    w[bad * hidden + 5] = nan_of<bf16>();
    DeviceBuffer<bf16> hd(h), wd(w), dh(n * hidden);
    DeviceBuffer<int32_t> td(targets);
    DeviceBuffer<float> loss(1), dw(vocab * hidden);
    DeviceBuffer<unsigned char> scratch(cuda::linear_cross_entropy_scratch_bytes(n, vocab, 16, true));
    cuda::linear_cross_entropy(hd.get(), wd.get(), td.get(), loss.get(), dh.get(), dw.get(), n, vocab, hidden, 0.f,
                               kIgnoreIndex, 16, scratch.get(), handle_, {ws_->get(), kGemmWorkspaceBytes}, nullptr);
    EXPECT_TRUE(std::isnan(loss.to_host()[0])) << "vocab row " << bad;
    EXPECT_TRUE(is_nan(dh.to_host()[0])) << "vocab row " << bad;
  }
}

}  // namespace
}  // namespace loom::test
