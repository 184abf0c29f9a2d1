// Forward passes of the building blocks (see layers.h).
#include "models/layers.h"

#include <algorithm>

#include "kernels/grouped_gemm.h"

namespace loom {

Tensor Linear::dense_weight(DType dtype) const { return nf4 ? nf4->dequantize(dtype) : weight.value().to(dtype); }

namespace {
// How an NF4 weight is made dense in dtype (each call dequantises it again).
ag::WeightFn dequantizer(const Linear& l, DType dtype) {
  return [q = l.nf4, dtype] { return q->dequantize(dtype); };
}
// The weight a product uses: the dense Variable, or an NF4 weight dequantised in dtype for this
// product (unless nothing reads it) with how backward dequantises it again.
std::pair<ag::Variable, ag::WeightFn> product_weight(const Linear& l, DType dtype, ag::OutputUse use) {
  if (!l.nf4) return {l.weight, {}};
  ag::WeightFn again = dequantizer(l, dtype);
  Tensor w = use == ag::OutputUse::kRead ? again() : Tensor::empty(l.nf4->shape, dtype, l.nf4->device());
  return {ag::Variable(w, false), std::move(again)};
}
// The adapter's arguments: bf16 GEMMs with f32 accumulation, B's product accumulated into the base
// output by the GEMM, the adapter's small operands at nearly f32 precision (see fn_lora.cpp).
ag::LoraArgs lora_args(const LoraAdapter& a, int64_t x_spare = 0, int64_t w_spare = 0) {
  return ag::LoraArgs{a.scale, a.training ? a.dropout : 0.f, a.dropout_seed, a.dropout_offset, x_spare, w_spare};
}
}  // namespace

int64_t padded_spare(int64_t cols, int64_t spare) {
  // Rows 128 bytes apart in bf16 where cols allows it (a multiple of 8): the GEMMs' row loads start
  // on whole 128-byte lines. The padding is memory only; K stays cols + the columns used. H100,
  // 1B shape: rows 2104 elements apart (16-byte aligned) ran 0.6-1.1 % slower than 2096 (32-byte).
  if (spare <= 0) return 0;
  const int64_t unit = cols % 8 == 0 ? 64 : 8;
  return (cols + spare + unit - 1) / unit * unit - cols;
}

namespace {
// The adapter's one-GEMM columns (3 r, + 1 for the bias) for a product in dtype, before asking
// whether the weight has room for them.
int64_t one_gemm_columns(const Linear& l, DType dtype) {
  if (dtype != DType::bf16 || !l.lora || !l.lora->enabled || l.lora->dropout > 0.f) return 0;
  return 3 * l.lora->A.size(0) + (l.bias.defined() ? 1 : 0);  // t's bf16 parts, and a column of ones for the bias
}
}  // namespace

ag::Variable Linear::forward(const ag::Variable& x, const ag::InputFn& recompute_x, ag::OutputUse use,
                             int64_t x_spare, const ag::Variable* residual) const {
  const ag::Variable* b = bias.defined() ? &bias : nullptr;
  const auto [w, rematerialize] = product_weight(*this, x.dtype(), use);
  if (!lora || !lora->enabled) {
    const ag::Variable y = nf4 ? ag::frozen_linear(x, w, rematerialize, b, use) : ag::linear(x, weight, b, use);
    return residual ? ag::add(*residual, y, use) : y;
  }
  return ag::lora_linear(x, w, lora->A, lora->B, lora_args(*lora, x_spare, nf4 ? 0 : weight_spare), b, rematerialize,
                         recompute_x, use, residual);
}

std::vector<ag::Variable> forward_shared_input(const std::vector<const Linear*>& ls, const ag::Variable& x,
                                               int64_t x_spare) {
  // Those that can share: an enabled adapter without dropout in effect on a frozen weight, bf16, the
  // first such one's scale.
  std::vector<size_t> shared;
  for (size_t i = 0; i < ls.size(); ++i) {
    const Linear& l = *ls[i];
    if (x.dtype() == DType::bf16 && l.lora && l.lora->enabled && lora_args(*l.lora).dropout <= 0.f &&
        (l.nf4 || (!l.weight.requires_grad() && l.weight.dtype() == DType::bf16)) &&
        (shared.empty() || l.lora->scale == ls[shared.front()]->lora->scale))
      shared.push_back(i);
  }
  if (shared.size() < 2) shared.clear();
  std::vector<ag::LoraProduct> products;
  for (size_t i : shared) {
    const Linear& l = *ls[i];
    ag::LoraProduct p;
    if (l.nf4) {
      p.make_weight = dequantizer(l, DType::bf16);
    } else {
      p.weight = l.weight.value();
    }
    p.a = &l.lora->A, p.b = &l.lora->B, p.bias = l.bias.defined() ? &l.bias : nullptr;
    p.lora = lora_args(*l.lora, x_spare, l.nf4 ? 0 : l.weight_spare);
    products.push_back(std::move(p));
  }
  const std::vector<ag::Variable> together = products.empty() ? std::vector<ag::Variable>{} : ag::lora_linears(x, products);
  std::vector<ag::Variable> out;
  for (size_t i = 0, j = 0; i < ls.size(); ++i) {
    if (j < shared.size() && shared[j] == i) {
      out.push_back(together[j++]);
    } else {
      out.push_back(ls[i]->forward(x, {}, ag::OutputUse::kRead, x_spare));
    }
  }
  return out;
}

int64_t Linear::adapter_spare(DType dtype) const {
  const int64_t ext = one_gemm_columns(*this, dtype);
  // The weight must have the room too (and still be the widened view: a merge or a move to another
  // device makes it contiguous again).
  if (ext == 0 || nf4 || weight_spare < ext || weight.dtype() != dtype || !ops::widen_rows(weight.value(), ext).defined())
    return 0;
  return ext;
}

void Linear::widen_for_adapter() {
  const int64_t ext = one_gemm_columns(*this, DType::bf16);
  if (ext > 0) widen(ext);
}

void Linear::widen(int64_t columns) {
  if (nf4 || !weight.defined() || weight.requires_grad() || weight.dtype() != DType::bf16 || weight.value().dim() != 2) return;
  if (columns <= 0 || (weight_spare >= columns && ops::widen_rows(weight.value(), columns).defined())) return;
  const int64_t out = weight.size(0), in = weight.size(1), spare = padded_spare(in, columns);
  Tensor wide = Tensor::empty({out, in + spare}, weight.dtype(), weight.value().device());
  Tensor body = wide.narrow(1, 0, in);
  ops::copy_rows_(body, weight.value());
  weight = ag::Variable(body, false);
  weight_spare = spare;
}

int64_t input_spare(const std::vector<const Linear*>& readers, DType dtype) {
  if (readers.empty()) return 0;
  int64_t spare = 0;
  for (const Linear* l : readers) {
    const int64_t s = l->adapter_spare(dtype);
    if (s == 0) return 0;
    spare = std::max(spare, s);
  }
  return padded_spare(readers.front()->in_features(), spare);
}

std::vector<Linear*> Attention::input_readers() {
  std::vector<Linear*> out;
  for (Linear* l : {&q_proj, &k_proj, &v_proj, &qkv_proj})
    if (present(*l)) out.push_back(l);
  return out;
}

std::vector<Linear*> Mlp::input_readers() {
  std::vector<Linear*> out;
  for (Linear* l : {&gate_proj, &up_proj, &gate_up_proj})
    if (present(*l)) out.push_back(l);
  return out;
}

int64_t Attention::input_spare(DType dtype) const {
  const std::vector<Linear*> readers = const_cast<Attention*>(this)->input_readers();
  return loom::input_spare({readers.begin(), readers.end()}, dtype);
}

int64_t Mlp::input_spare(DType dtype) const {
  const std::vector<Linear*> readers = const_cast<Mlp*>(this)->input_readers();
  return loom::input_spare({readers.begin(), readers.end()}, dtype);
}

ag::Variable Linear::forward_glu(const ag::Variable& gate, const ag::Variable& up, bool gelu, ag::OutputUse use,
                                 const ag::Variable* residual) const {
  // Fused where the activation's backward runs anyway (gate or up needs a gradient): it makes h
  // again there for the adapter's dA. Else h is kept, as below, and no dgate/dup is computed.
  const bool fused = lora && lora->enabled && lora_args(*lora).dropout <= 0.f &&
                     !(weight.defined() && weight.requires_grad()) && (gate.requires_grad() || up.requires_grad());
  if (fused) {
    const auto [w, rematerialize] = product_weight(*this, gate.dtype(), use);
    return ag::glu_lora_linear(gate, up, gelu, w, lora->A, lora->B, lora_args(*lora), bias.defined() ? &bias : nullptr,
                               rematerialize, use, residual);
  }
  const ag::Variable h = gelu ? ag::geglu(gate, up) : ag::swiglu(gate, up);
  // The activation's backward keeps gate and up; an adapter computes h from them again rather than
  // keeping a third [tokens, intermediate] tensor alive until backward.
  ag::InputFn again;
  if (gate.requires_grad() || up.requires_grad())
    again = [g = gate.value(), u = up.value(), gelu] { return gelu ? ops::geglu(g, u) : ops::swiglu(g, u); };
  return forward(h, again, use, 0, residual);
}

std::vector<Linear*> Attention::linears() {
  std::vector<Linear*> out;
  for (Linear* l : {&q_proj, &k_proj, &v_proj, &qkv_proj, &o_proj})
    if (present(*l)) out.push_back(l);
  return out;
}

std::vector<Linear*> Mlp::linears() {
  std::vector<Linear*> out;
  for (Linear* l : {&gate_proj, &up_proj, &gate_up_proj, &down_proj})
    if (present(*l)) out.push_back(l);
  return out;
}

ag::Variable Mlp::forward(const ag::Variable& x, ag::OutputUse use, int64_t x_spare,
                          const ag::Variable* residual) const {
  ag::Variable gate, up;
  if (present(gate_up_proj)) {  // transformers' Phi3MLP: gate, up = gate_up_proj(x).chunk(2, dim=-1)
    const int64_t inter = gate_up_proj.out_features() / 2;
    std::vector<ag::Variable> parts = ag::split(gate_up_proj.forward(x, {}, ag::OutputUse::kRead, x_spare), {inter, inter});
    gate = parts[0], up = parts[1];
  } else {
    const std::vector<ag::Variable> gu = forward_shared_input({&gate_proj, &up_proj}, x, x_spare);
    gate = gu[0], up = gu[1];
  }
  return down_proj.forward_glu(gate, up, gelu, use, residual);
}

Tensor ExpertLinear::dense_weight(DType dtype, int64_t first, int64_t count) const {
  if (count < 0) count = experts - first;
  LOOM_CHECK(first >= 0 && count >= 0 && first + count <= experts, name, ": experts [", first, ", ", first + count,
             ") of ", experts);
  if (!quantized()) return weight.value().narrow(0, first, count).to(dtype);
  if (!scratch || count == 0) {
    Tensor w = Tensor::empty({count, out, in}, dtype, nf4[0]->device());
    dequantize_into(w, first);
    return w;
  }
  // The kept buffer may still hold them: a backward's first chunk is its forward's last one.
  const DequantScratch::Contents contents{nf4[static_cast<size_t>(first)], count};
  bool ready = false;
  Tensor w = scratch->take({count, out, in}, dtype, nf4[0]->device(), contents, &ready);
  if (!ready) {
    dequantize_into(w, first);
    scratch->filled(w, contents);
  }
  return w;
}

void ExpertLinear::dequantize_into(Tensor& w, int64_t first) const {
  const int64_t count = w.size(0);
  if (count == 0) return;
  // The experts in one batched dequantisation (on CUDA a launch per 64 experts, not one each).
  std::vector<ops::Nf4Parts> parts;
  for (int64_t e = first; e < first + count; ++e) parts.push_back(nf4[static_cast<size_t>(e)]->parts());
  ops::nf4_dequantize_experts_into(parts, w);
}

int64_t ExpertLinear::chunk_experts(DType dtype) const {
  if (experts == 0) return 0;
  if (dequant_chunk > 0) return std::min(dequant_chunk, experts);
  const int64_t per_expert = std::max<int64_t>(1, bytes_for(dtype, out * in));
  const int64_t fit = std::max<int64_t>(1, kDequantChunkBytes / per_expert);
  const int64_t chunks = (experts + fit - 1) / fit;  // as few as fit, then as even as they can be
  return (experts + chunks - 1) / chunks;
}

bool ExpertLinear::keeps_input() const {
  return (lora && lora->enabled && lora->A.requires_grad()) || (weight.defined() && weight.requires_grad());
}

ag::Variable ExpertLinear::forward(const ag::Variable& xs, const std::vector<int64_t>& offsets, ag::OutputUse use,
                                   const ag::InputFn& recompute_x) const {
  // The product with w (a Variable, or an ExpertWeightFn made on demand), with the adapter when enabled.
  auto through = [&](const auto& w) {
    if (!lora || !lora->enabled) return ag::grouped_linear(xs, w, offsets, use, recompute_x);
    return ag::grouped_linear_lora(xs, w, lora->A, lora->B, lora->scale, offsets, use, recompute_x);
  };
  if (!quantized()) return through(weight);
  // NF4 experts are dequantised for each product, a chunk of experts at a time (forward, and the
  // input gradient in backward), so a layer never holds more than a chunk of them in the compute dtype.
  const int64_t chunk = chunk_experts(xs.dtype());
  ag::ExpertWeightFn w;
  w.shape = {experts, out, in}, w.chunk = chunk;
  w.make = [this](int64_t first, int64_t count, DType dtype) { return dense_weight(dtype, first, count); };
  if (scratch && ag::recomputing() && chunk >= experts) {
    // In a checkpoint's recomputation backward follows at once: when the whole weight is one chunk the
    // product keeps it (the scratch's buffer, allocated either way) rather than dequantise a third time.
    return through(ag::Variable(dense_weight(xs.dtype()), false));
  }
  // (Grouped GEMMs that multiply by the NF4 codes themselves ran the 24-layer Qwen3-30B-A3B QLoRA
  // recompute row 14-16 % slower than dequantising first, H200, sessions 37 and 40: kernels/grouped_gemm.h.)
  return through(w);
}

ag::Variable MoeMlp::forward(const ag::Variable& x, RouterOutput* out, ag::OutputUse use) const {
  const int64_t experts = gate_up.experts, inter = gate_up.out / 2;
  // transformers: F.linear(hidden, router.weight) in the model dtype, then softmax in f32.
  const ag::Variable logits = ag::cast(ag::linear(x, router), x.dtype() == DType::f64 ? DType::f64 : DType::f32);
  ag::MoeRouting r = ag::moe_route(logits, top_k, renormalize);
  if (out) *out = RouterOutput{logits, r.route.ids};
  const ops::MoeDispatch d = ops::moe_dispatch(r.route.ids, experts);
  const ag::Variable xs = ag::moe_gather(x, d, top_k);
  // The gathered rows, made again from the tokens (k times smaller) where backward needs them.
  ag::InputFn gathered_again;
  if (gate_up.keeps_input())
    gathered_again = [tokens = d.token_of_row.to(x.device()), xv = x.value()] { return ops::embedding(tokens, xv); };
  std::vector<ag::Variable> gu = ag::split(gate_up.forward(xs, d.offsets, ag::OutputUse::kRead, gathered_again),
                                           {inter, inter});
  // The routing weights in the activations' accumulation dtype (f32, or f64 in f64 runs); Qwen3-MoE
  // rounds them to the model dtype first. They scale each row before down (see the struct's comment).
  ag::Variable w = r.weights;
  if (round_weights && x.dtype() != w.dtype()) w = ag::cast(w, x.dtype());
  if (x.dtype() != DType::f64) w = ag::cast(w, DType::f32);
  // The SwiGLU rows and their weighted copy, made again in backward from gate and up (which the
  // activation's backward keeps anyway) where the weights' and the adapter's gradients read them.
  const ag::Variable w_rows = ag::moe_row_weights(w, d);
  const Tensor rows = d.rows.to(x.device());
  const ag::InputFn swiglu_again = [g = gu[0].value(), u = gu[1].value()] { return ops::swiglu(g, u); };
  const ag::Variable hw = ag::moe_combine(ag::swiglu(gu[0], gu[1]), w_rows, rows, swiglu_again);
  ag::InputFn weighted_again;
  if (down.keeps_input())
    weighted_again = [swiglu_again, wv = w_rows.value(), rows] { return ops::moe_combine(swiglu_again(), rows, wv); };
  return ag::moe_sum(down.forward(hw, d.offsets, use, weighted_again), d, top_k, use);
}

}  // namespace loom
