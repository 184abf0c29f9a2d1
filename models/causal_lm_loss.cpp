// The causal-LM objectives on a CausalLM: the next-token loss (fused with the LM head where the
// head is a plain product), the per-sequence log-probabilities the preference objectives need, and
// the MoE routers' load-balancing loss that joins them.
#include "models/causal_lm.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "models/block.h"

namespace loom {

ag::Variable CausalLM::loss(const Tensor& input_ids, const Tensor& labels, const ForwardOptions& options) const {
  LOOM_CHECK(input_ids.dim() == 2 && input_ids.dtype() == DType::i32 && labels.dtype() == DType::i32 &&
                 labels.shape() == input_ids.shape(),
             "CausalLM::loss: input_ids ", input_ids.str(), " and labels ", labels.str(),
             " must both be i32 [batch, seq]");
  return loss_from_targets(input_ids, shift_labels(labels), options);
}

ag::Variable CausalLM::loss_from_targets(const Tensor& input_ids, const Tensor& targets,
                                         const ForwardOptions& options) const {
  LOOM_CHECK(input_ids.dim() == 2 && input_ids.dtype() == DType::i32 && targets.dtype() == DType::i32 &&
                 targets.dim() == 1 && targets.numel() == input_ids.numel(),
             "CausalLM::loss: input_ids ", input_ids.str(), " and targets ", targets.str(),
             " must be i32 [batch, seq] and i32 [batch*seq]");
  if (absl::Status s = check_token_ids(targets, config_.vocab_size, true, "targets"); !s.ok()) LOOM_CHECK(false, s.message());
  detail::LayerContext ctx = context_for(input_ids, options);
  std::vector<RouterOutput> routers;
  const bool aux = config_.moe.experts > 0 && (options.router_aux_loss_coef > 0 || options.aux_loss);
  if (aux) ctx.routers = &routers;
  ag::Variable h = hidden_states(input_ids, ctx, nullptr);
  const Tensor t = targets.to(placement_.head);
  h = ag::reshape(ag::to_device(h, placement_.head), {input_ids.numel(), h.size(2)});
  // A LoRA adapter or a bias on lm_head is not part of the fused product, and a weight stored in
  // another dtype than the activations (a quantized head) is not a plain GEMM: take the plain path.
  ag::Variable loss = lm_head_.lora || lm_head_.bias.defined() || lm_head_.weight.dtype() != h.dtype()
                          ? ag::cross_entropy(head(h), t)  // head() applies the final soft-cap
                          : ag::linear_cross_entropy(h, lm_head_.weight, t, config_.final_logit_softcapping);
  if (!aux || routers.empty()) return loss;
  const ag::Variable balance = load_balancing_loss(routers, options.aux_spans);
  if (options.aux_loss) *options.aux_loss = balance;
  if (options.router_aux_loss_coef <= 0) return loss;
  return add_load_balancing(loss, balance, options.router_aux_loss_coef);
}

ag::Variable add_load_balancing(const ag::Variable& loss, const ag::Variable& aux, double coef) {
  if (coef <= 0 || !aux.defined()) return loss;
  const ag::Variable scaled = ag::scale(ag::to_device(aux, loss.device()), static_cast<float>(coef));
  return ag::add(loss, ag::cast(scaled, loss.dtype()));
}

ag::Variable load_balancing_loss(const std::vector<RouterOutput>& routers, const std::vector<TokenSpan>& spans) {
  LOOM_CHECK(!routers.empty(), "load_balancing_loss: no router outputs");
  // Every MoE layer's rows together (transformers concatenates the layers' logits): the formula sums
  // over rows, so [tokens, layers * E] read as [tokens * layers, E] serves.
  std::vector<ag::Variable> logits;
  std::vector<Tensor> ids;
  std::vector<int64_t> widths;
  const Device d = routers[0].logits.device();  // layers placed on several devices meet on the first's
  for (const RouterOutput& r : routers) {
    logits.push_back(ag::to_device(r.logits, d));
    ids.push_back(r.ids.to(d));
    widths.push_back(r.ids.size(1));
  }
  const int64_t tokens = routers[0].logits.size(0), experts = routers[0].logits.size(1);
  const int64_t layers = static_cast<int64_t>(routers.size()), k = widths[0];
  ag::Variable all = ag::cat_last(logits);  // [tokens, layers * E]
  Tensor chosen = ops::cat_last(ids, widths);  // [tokens, layers * k]
  int64_t counted = tokens;
  if (!spans.empty()) {  // the spans' rows alone, in order (transformers' masked means are means over them)
    counted = 0;
    for (const TokenSpan& s : spans) {
      LOOM_CHECK(s.start >= 0 && s.length >= 0 && s.start + s.length <= tokens, "load_balancing_loss: span {", s.start,
                 ", ", s.length, "} is outside the ", tokens, " tokens routed");
      counted += s.length;
    }
    LOOM_CHECK(counted > 0, "load_balancing_loss: the spans hold no token");
    std::vector<ag::Variable> rows;
    Tensor picked = Tensor::empty({counted, layers * k}, chosen.dtype(), chosen.device());
    int64_t at = 0;
    for (const TokenSpan& s : spans) {
      if (s.length == 0) continue;
      rows.push_back(ag::reshape(ag::narrow(all, 0, s.start, s.length), {1, s.length * layers * experts}));
      picked.narrow(0, at, s.length).copy_(chosen.narrow(0, s.start, s.length));
      at += s.length;
    }
    all = rows.size() == 1 ? rows[0] : ag::cat_last(rows);
    chosen = picked;
  }
  // [tokens, layers * E] read as [tokens * layers, E]: the formula sums over rows.
  const int64_t n = counted * layers;
  return ag::moe_aux_loss(ag::reshape(all, {n, experts}), chosen.reshape({n, k}));
}

std::vector<ag::Variable> CausalLM::sequence_logps(const Tensor& input_ids, const Tensor& targets,
                                                   const ForwardOptions& options, std::vector<Span> spans) const {
  LOOM_CHECK(input_ids.dim() == 2 && input_ids.dtype() == DType::i32 && targets.dtype() == DType::i32 &&
                 targets.dim() == 1 && targets.numel() == input_ids.numel() && targets.device().is_cpu(),
             "CausalLM::sequence_logps: input_ids ", input_ids.str(), " and targets ", targets.str(),
             " must be i32 [batch, seq] and host i32 [batch*seq]");
  if (absl::Status s = check_token_ids(targets, config_.vocab_size, true, "targets"); !s.ok()) LOOM_CHECK(false, s.message());
  const int64_t batch = input_ids.size(0), seq = input_ids.size(1);
  if (spans.empty())
    for (int64_t b = 0; b < batch; ++b) spans.push_back({b * seq, seq});
  for (const Span& sp : spans)
    LOOM_CHECK(sp.start >= 0 && sp.length >= 0 && sp.start + sp.length <= batch * seq, "CausalLM::sequence_logps: span {",
               sp.start, ", ", sp.length, "} is outside ", batch, " x ", seq, " positions");
  detail::LayerContext ctx = context_for(input_ids, options);
  std::vector<RouterOutput> routers;
  if (options.aux_loss && config_.moe.experts > 0) ctx.routers = &routers;
  ag::Variable h =
      ag::reshape(ag::to_device(hidden_states(input_ids, ctx, nullptr), placement_.head), {batch * seq, config_.hidden_size});
  if (!routers.empty()) *options.aux_loss = load_balancing_loss(routers, options.aux_spans);
  const std::vector<int32_t> t = targets.to_ints();
  const bool fused = !(lm_head_.lora || lm_head_.bias.defined() || lm_head_.weight.dtype() != h.dtype());
  std::vector<ag::Variable> out;
  for (const Span& sp : spans) {
    int64_t n = 0;
    for (int64_t i = sp.start; i < sp.start + sp.length; ++i) n += t[i] != ops::kIgnoreIndex;
    if (n == 0) {
      out.emplace_back(Tensor::zeros({}, DType::f32, placement_.head));
      continue;
    }
    ag::Variable hb = ag::narrow(h, 0, sp.start, sp.length);
    const Tensor tb = targets.narrow(0, sp.start, sp.length).contiguous().to(placement_.head);
    // The mean cross-entropy over the span's n targets, times -n: their summed log-probability.
    ag::Variable ce = fused ? ag::linear_cross_entropy(hb, lm_head_.weight, tb, config_.final_logit_softcapping)
                            : ag::cross_entropy(head(hb), tb);
    out.push_back(ag::cast(ag::scale(ce, -static_cast<float>(n)), DType::f32));
  }
  return out;
}

Tensor shift_labels(const Tensor& labels) {
  LOOM_CHECK(labels.dim() == 2 && labels.dtype() == DType::i32, "shift_labels: labels must be i32 [batch, seq], got ",
             labels.str());
  const int64_t batch = labels.size(0), seq = labels.size(1);
  std::vector<int32_t> l = labels.to_ints(), targets(l.size(), ops::kIgnoreIndex);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s + 1 < seq; ++s) targets[b * seq + s] = l[b * seq + s + 1];
  return Tensor::from_ints(targets, {batch * seq});
}

ag::Variable causal_lm_loss(const ag::Variable& logits, const Tensor& labels, float softcap) {
  LOOM_CHECK(logits.value().dim() == 3 && labels.dim() == 2 && labels.size(0) == logits.size(0) &&
                 labels.size(1) == logits.size(1) && labels.dtype() == DType::i32,
             "causal_lm_loss: logits ", logits.value().str(), " and labels ", labels.str(), " must be [batch, seq, vocab] and i32 [batch, seq]");
  const int64_t batch = labels.size(0), seq = labels.size(1), vocab = logits.size(2);
  const Tensor t = shift_labels(labels).to(logits.device());
  return ag::cross_entropy(ag::reshape(logits, {batch * seq, vocab}), t, softcap);
}

}  // namespace loom
