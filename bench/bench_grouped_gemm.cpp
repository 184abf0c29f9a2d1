// Benchmarks of the grouped expert GEMMs (kernels/grouped_gemm.h) at Qwen3-30B-A3B's and
// Mixtral-8x7B's MoE shapes: each expert projection's forward, input gradient (dgrad) and weight
// gradient (wgrad), through the automatic choice (the name without a variant: what ops:: runs, and
// what peer_torch.py's torch._grouped_mm is compared with) and through each variant by name (the
// measurements behind choose_grouped_gemm; sm90 is Loom's own Hopper kernel). The LoRA factors'
// products on the experts (rank 16: x A_e^T forward, and dA_e = dt_e^T x_e into f32, the bf16 -> f32
// case cuBLAS's grouped call lacks) are timed too. Expert row counts come from a softmax router's
// top-k choices, drawn the same way in peer_torch.py so that both sides multiply the same groups.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_tma.h"

namespace loom::bench {
namespace {

struct MoeShape {
  const char* name;
  int64_t hidden, width, experts, top_k, tokens;  // width: one expert's intermediate size
};
// Qwen3-30B-A3B: 4 sequences of 2048 tokens; Mixtral-8x7B: 8192 tokens (4 x 2048 as well).
constexpr MoeShape kShapes[] = {{"qwen3_30b_a3b", 2048, 768, 128, 8, 4 * 2048},
                                {"mixtral_8x7b", 4096, 14336, 8, 2, 4 * 2048}};

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Stream `stream`'s value i, uniform in (0, 1).
double uniform(uint64_t stream, uint64_t i) {
  return (double(splitmix64((stream << 32) + i) >> 11) + 0.5) * 0x1p-53;
}

// Each token's top_k experts drawn without replacement from softmax(router logits) (Gumbel top-k:
// the k largest logit_e - log(-log(u))), the logits uniform with standard deviation 1 (expert
// loads differ as a trained router's do); rows grouped by expert as offsets [E + 1].
// bench/peer_torch.py's routing_counts draws the same numbers.
std::vector<int64_t> routing_offsets(const MoeShape& s) {
  const int64_t e_count = s.experts;
  std::vector<double> logit(e_count);
  for (int64_t e = 0; e < e_count; ++e) logit[e] = std::sqrt(3.0) * (2.0 * uniform(1, e) - 1.0);
  std::vector<int64_t> count(e_count, 0);
  std::vector<std::pair<double, int64_t>> score(e_count);
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t e = 0; e < e_count; ++e)
      score[e] = {logit[e] - std::log(-std::log(uniform(2, t * e_count + e))), e};
    std::partial_sort(score.begin(), score.begin() + s.top_k, score.end(), std::greater<>());
    for (int64_t j = 0; j < s.top_k; ++j) ++count[score[j].second];
  }
  std::vector<int64_t> offsets{0};
  for (int64_t c : count) offsets.push_back(offsets.back() + c);
  return offsets;
}

enum class Product { kFwd, kDgrad, kWgrad };
const char* product_name(Product p) { return p == Product::kFwd ? "fwd" : p == Product::kDgrad ? "dgrad" : "wgrad"; }

// What every grouped benchmark's body gets: the shape's routing, the GPU's context and the slots of
// the problem descriptors or pointer arrays.
struct Setup {
  std::vector<int64_t> off;  // [E + 1]
  int64_t n, experts;        // rows, experts
  const BenchContext& c;
  cuda::GroupedGemmContext gc;
  DeviceArray<void*>& pointers;
};

// Registers grouped_gemm/bf16/<shape>/<what>[/<variant>]; skipped where kSm90 cannot run.
void add_variant(const MoeShape& s, const std::string& what, GroupedGemmVariant v,
                 std::function<void(benchmark::State&, const Setup&)> body) {
  std::string name = std::string("grouped_gemm/bf16/") + s.name + "/" + what;
  if (v != GroupedGemmVariant::kAuto) name += std::string("/") + grouped_gemm_variant_name(v);
  add(name, [=](benchmark::State& st) {
    if ((v == GroupedGemmVariant::kSm90 || v == GroupedGemmVariant::kSm90Wide) && !cuda::sm90_grouped_gemm_ready()) {
      st.SkipWithError("the sm90 kernel needs an sm_90 GPU and an sm_90a build");
      return;
    }
    const std::vector<int64_t> off = routing_offsets(s);
    const BenchContext& c = ctx();
    DeviceArray<void*> pointers(cuda::grouped_gemm_pointer_slots(size_t(s.experts)));
    body(st, Setup{off, off.back(), s.experts, c, {c.cublas, c.cublaslt, c.gemm_ws, c.sm_count}, pointers});
  });
}

// One projection of every expert, in -> out, weights [E, out, in] as checkpoints store them:
//   fwd:   y [N, out] = x [N, in] w_e^T;   dgrad: dx [N, in] = dy [N, out] w_e;
//   wgrad: dw [E, out, in] = dy_e^T x_e.   Each 2 N in out FLOP.
// The problem list is built inside the timed launch, as ops:: builds it on every call.
void add_grouped(const MoeShape& s, const std::string& proj, int64_t in, int64_t out, Product p,
                 GroupedGemmVariant v, GemmType c_type = GemmType::kBF16, float beta = 0.f) {
  const std::string what = proj + "_" + product_name(p) + (beta != 0.f ? "_accumulate" : "");
  add_variant(s, what, v, [=](benchmark::State& st, const Setup& u) {
    const std::vector<int64_t>& off = u.off;
    const int64_t n = u.n, e_count = u.experts;
    const BenchContext& c = u.c;
    const int64_t rows_in = p == Product::kFwd ? in : out;  // the row-major input's width
    auto act = random_array<bf16>(size_t(n * rows_in));     // x (fwd), dy (dgrad, wgrad)
    auto other = random_array<bf16>(size_t(p == Product::kWgrad ? n * in : e_count * out * in));  // x, or w
    const size_t result_size = size_t(p == Product::kWgrad ? e_count * out * in : n * (p == Product::kFwd ? out : in));
    DeviceArray<float> result(c_type == GemmType::kF32 ? result_size : result_size / 2 + 1);  // bf16: half the bytes
    auto problems = [&] {
      if (p == Product::kWgrad) {
        ReductionGroupedGemm g;
        g.a = act.get(), g.lda = out, g.b = other.get(), g.ldb = in, g.c = result.get();
        g.m = out, g.k = in, g.ab_type = GemmType::kBF16, g.c_type = c_type, g.beta = beta;
        return reduction_grouped_problems(g, off);
      }
      RowGroupedGemm g;
      g.a = act.get(), g.lda = rows_in, g.b = other.get(), g.c = result.get();
      g.k = rows_in, g.m = p == Product::kFwd ? out : in, g.trans_b = p == Product::kFwd;
      g.ab_type = GemmType::kBF16, g.c_type = c_type, g.beta = beta;
      return row_grouped_problems(g, off);
    };
    run_timed(st, {0, 2.0 * double(n) * double(in) * double(out), Bound::kCompute},
              [&] { cuda::grouped_gemm(problems(), v, u.gc, u.pointers.get(), c.stream); });
    if (v == GroupedGemmVariant::kAuto) {  // which variant the rule picked: 0 the loop, 1 cuBLAS's grouped call, 2 sm90
      const GroupedGemmVariant pick = choose_grouped_gemm(problems(), c.sm_count);
      st.counters["picks"] = pick == GroupedGemmVariant::kLoop ? 0 : pick == GroupedGemmVariant::kCublasGrouped ? 1 : 2;
    }
  });
}

// A projection's operands with random values, rows x in -> out over e_count experts (fwd: x [rows, in],
// w [E, out, in]; dgrad: dy [rows, out], w as [K = out, in]), bf16 out, and a rank-r term (t [rows, r],
// b [E, out, r] fwd or a [E, r, in] dgrad; r = 0: none): `g` the base product, `g2` the term.
struct LoraProduct {
  DeviceArray<bf16> act, w, act2, w2;
  DeviceArray<float> result;
  RowGroupedGemm g, g2;
  int64_t k, m;  // the base product's depth and width
  LoraProduct(int64_t rows, int64_t e_count, int64_t in, int64_t out, int64_t r, bool fwd)
      : act(random_array<bf16>(size_t(rows * (fwd ? in : out)))), w(random_array<bf16>(size_t(e_count * out * in))),
        act2(random_array<bf16>(size_t(rows * std::max<int64_t>(r, 1)))),
        w2(random_array<bf16>(size_t(e_count * std::max<int64_t>(r, 1) * (fwd ? out : in)))),
        result(size_t(rows * (fwd ? out : in)) / 2 + 1), k(fwd ? in : out), m(fwd ? out : in) {
    g.a = act.get(), g.lda = k, g.b = w.get(), g.c = result.get();
    g.k = k, g.m = m, g.trans_b = fwd;
    g.ab_type = GemmType::kBF16, g.c_type = GemmType::kBF16;
    g2 = g;
    g2.a = act2.get(), g2.lda = r, g2.b = w2.get(), g2.k = r;
  }
};

// A LoRA projection's base product with its rank-r term in the same accumulation
// (cuda::grouped_gemm_dual, autograd/fn_grouped.cpp): fwd y = x w_e^T + t b_e^T, dgrad
// dx = dy w_e + dt a_e. FLOP: 2 N (in out + r out) fwd, 2 N (out in + r in) dgrad.
void add_dual(const MoeShape& s, const std::string& proj, int64_t in, int64_t out, int64_t r, Product p,
              GroupedGemmVariant v) {
  const std::string what = proj + "_" + product_name(p) + "_dual_r" + std::to_string(r);
  add_variant(s, what, v, [=](benchmark::State& st, const Setup& u) {
    const LoraProduct lp(u.n, u.experts, in, out, r, p == Product::kFwd);
    run_timed(st, {0, 2.0 * double(u.n) * double(lp.k + r) * double(lp.m), Bound::kCompute}, [&] {
      cuda::grouped_gemm_dual(row_grouped_problems(lp.g, u.off), row_grouped_problems(lp.g2, u.off), v, u.gc,
                              u.pointers.get(), u.c.stream);
    });
  });
}

// Registers `name`, a benchmark of a Hopper kernel given the shape's routing (skipped off sm_90a).
void add_sm90(const MoeShape& s, const std::string& name,
              std::function<void(benchmark::State&, const std::vector<int64_t>&, const BenchContext&)> body) {
  add(name, [=](benchmark::State& st) {
    if (!cuda::sm90_grouped_gemm_ready()) {
      st.SkipWithError("the sm90 kernel needs an sm_90 GPU and an sm_90a build");
      return;
    }
    body(st, routing_offsets(s), ctx());
  });
}

// The TMA-fed Hopper kernel (kernels/grouped_gemm_tma.h) on a projection's fwd or dgrad, alone or with
// the rank-r LoRA term in the same accumulation (r > 0: the products add_dual times), in clusters of
// one or two CTAs: grouped_gemm/bf16/<shape>/<proj>_<fwd|dgrad>[_dual_r<r>]/sm90_tma[_c2], beside
// add_grouped's and add_dual's rows of the same products.
void add_tma(const MoeShape& s, const std::string& proj, int64_t in, int64_t out, Product p, int r, int cluster) {
  const std::string name = std::string("grouped_gemm/bf16/") + s.name + "/" + proj + "_" + product_name(p) +
                           (r > 0 ? "_dual_r" + std::to_string(r) : "") + (cluster == 2 ? "/sm90_tma_c2" : "/sm90_tma");
  add_sm90(s, name, [=](benchmark::State& st, const std::vector<int64_t>& off, const BenchContext& c) {
    const LoraProduct lp(off.back(), s.experts, in, out, r, p == Product::kFwd);
    run_timed(st, {0, 2.0 * double(off.back()) * double(lp.k + r) * double(lp.m), Bound::kCompute},
              [&] { cuda::sm90_grouped_gemm_tma(lp.g, r > 0 ? &lp.g2 : nullptr, off, cluster, c.sm_count, c.stream); });
  });
}

}  // namespace

void register_grouped_gemm() {
  for (const MoeShape& s : kShapes)
    for (auto [proj, in, out] : {std::tuple{"gate_up", s.hidden, 2 * s.width}, std::tuple{"down", s.width, s.hidden}})
      for (Product p : {Product::kFwd, Product::kDgrad, Product::kWgrad})
        for (GroupedGemmVariant v :
             {GroupedGemmVariant::kAuto, GroupedGemmVariant::kLoop, GroupedGemmVariant::kCublasGrouped,
              GroupedGemmVariant::kSm90, GroupedGemmVariant::kSm90Wide})
          add_grouped(s, proj, in, out, p, v);
  // LoRA rank 16 on Qwen3's experts, every product autograd/fn_grouped.cpp runs: per projection
  // in -> out, the A factor as a projection in -> 16 (forward t = x A_e^T; dgrad dx = dt A_e; wgrad
  // dA_e) and the B factor as 16 -> out (forward y = t B_e^T, K = 16; dgrad dt = dy B_e, N = 16;
  // wgrad dB_e), the base products that accumulate onto them (beta 1), the base product and the rank-16
// term in one accumulation (dual, what fn_grouped.cpp runs now), and dA_e into f32.
  const MoeShape& q = kShapes[0];
  for (GroupedGemmVariant v : {GroupedGemmVariant::kAuto, GroupedGemmVariant::kLoop, GroupedGemmVariant::kCublasGrouped,
                               GroupedGemmVariant::kSm90, GroupedGemmVariant::kSm90Wide}) {
    for (auto [proj, in, out] : {std::tuple{"gate_up", q.hidden, 2 * q.width}, std::tuple{"down", q.width, q.hidden}}) {
      for (Product p : {Product::kFwd, Product::kDgrad, Product::kWgrad}) {
        add_grouped(q, std::string(proj) + "_lora_a", in, 16, p, v);
        add_grouped(q, std::string(proj) + "_lora_b", 16, out, p, v);
      }
      add_grouped(q, proj, in, out, Product::kFwd, v, GemmType::kBF16, 1.f);
      add_grouped(q, proj, in, out, Product::kDgrad, v, GemmType::kBF16, 1.f);
      add_dual(q, proj, in, out, 16, Product::kFwd, v);
      add_dual(q, proj, in, out, 16, Product::kDgrad, v);
    }
    if (v != GroupedGemmVariant::kCublasGrouped)  // cuBLAS's grouped call has no bf16 -> f32
      add_grouped(q, "lora_a_f32", q.hidden, 16, Product::kWgrad, v, GemmType::kF32);
  }
  for (const MoeShape& s : kShapes)
    for (auto [proj, in, out] : {std::tuple{"gate_up", s.hidden, 2 * s.width}, std::tuple{"down", s.width, s.hidden}})
      for (Product p : {Product::kFwd, Product::kDgrad})
        for (int cluster : {1, 2}) {
          add_tma(s, proj, in, out, p, 0, cluster);
          if (&s == &kShapes[0]) add_tma(s, proj, in, out, p, 16, cluster);
        }
}

}  // namespace loom::bench
