// The shared decoder-layer builders of models/block.h.
#include "models/block.h"

#include <tuple>

namespace loom::detail {

ag::Variable self_attention(const Attention& attn, const ag::Variable& h, const LayerContext& ctx, int64_t window,
                            int64_t x_spare) {
  const ModelConfig& c = *ctx.config;
  ag::Variable q, k, v;
  auto product = [&](const Linear& l) { return l.forward(h, {}, ag::OutputUse::kRead, x_spare); };
  if (present(attn.qkv_proj)) {  // Phi-3: one product, its rows q, then k, then v
    std::vector<ag::Variable> p = ag::split(product(attn.qkv_proj), {c.q_dim(), c.kv_dim(), c.kv_dim()});
    q = p[0], k = p[1], v = p[2];
  } else {
    const std::vector<ag::Variable> qkv = forward_shared_input({&attn.q_proj, &attn.k_proj, &attn.v_proj}, h, x_spare);
    q = qkv[0], k = qkv[1], v = qkv[2];
  }
  q = ag::reshape(q, {ctx.batch, ctx.seq, c.num_attention_heads, c.head_dim});
  k = ag::reshape(k, {ctx.batch, ctx.seq, c.num_key_value_heads, c.head_dim});
  v = ag::reshape(v, {ctx.batch, ctx.seq, c.num_key_value_heads, c.head_dim});
  if (attn.q_norm) q = attn.q_norm->forward(q);
  if (attn.k_norm) k = attn.k_norm->forward(k);
  ops::AttentionOptions opt;
  opt.scale = c.attention_scale();
  opt.softcap = c.attn_logit_softcapping;
  opt.window = window;
  opt.segment_ids = ctx.segment_ids;
  ag::Variable a;
  if (!ctx.k_cache) {  // training and scoring: rope (partial where the table is shorter than head_dim / 2) and
                       // attention as one node, q's rope backward inside attention's backward
    a = ag::rope_attention(q, k, v, ops::RopeArgs{ctx.positions, ctx.inv_freq, ctx.rope_mscale}, opt);
    return attn.o_proj.forward(ag::reshape(a, {ctx.batch, ctx.seq, c.q_dim()}));
  }
  // Generation: q and k rotated (one launch for both), k and v appended to the cache; a single new
  // token attends to all of it.
  std::tie(q, k) = ag::rope_qk(q, k, ctx.positions, ctx.inv_freq, ctx.rope_mscale);
  ctx.k_cache->narrow(1, ctx.cache_start, ctx.seq).copy_(k.value());
  ctx.v_cache->narrow(1, ctx.cache_start, ctx.seq).copy_(v.value());
  if (ctx.seq == 1) {
    Tensor o = ops::attention_decode(q.value().reshape({ctx.batch, c.num_attention_heads, c.head_dim}), *ctx.k_cache,
                                     *ctx.v_cache, ctx.cache_start + 1, opt);
    a = ag::Variable(o.reshape({ctx.batch, 1, c.num_attention_heads, c.head_dim}));
  } else {
    LOOM_CHECK(ctx.cache_start == 0, "self_attention: a multi-token step must start an empty cache");
    a = ag::attention(q, k, v, opt);
  }
  return attn.o_proj.forward(ag::reshape(a, {ctx.batch, ctx.seq, c.q_dim()}));
}

ag::Variable mlp(const DecoderLayer& L, const ag::Variable& h, const LayerContext& ctx, ag::OutputUse use,
                 int64_t x_spare, const ag::Variable* residual) {
  if (!L.moe) return L.mlp.forward(h, use, x_spare, residual);
  RouterOutput r;
  const ag::Variable y =
      L.moe->forward(ag::reshape(h, {ctx.batch * ctx.seq, h.size(-1)}), ctx.routers ? &r : nullptr, use);
  if (ctx.routers) ctx.routers->push_back(std::move(r));
  return residual ? ag::add(*residual, ag::reshape(y, h.shape()), use) : ag::reshape(y, h.shape());
}

ag::Variable prenorm_block(const DecoderLayer& L, const ag::Variable& x, const LayerContext& ctx) {
  // The norms' outputs carry spare columns for their readers' adapters (one GEMM each, see
  // ag::LoraArgs::x_spare). The attention's residual add and the MLP's norm in one pass (forward
  // and backward).
  const int64_t attn_spare = L.self_attn.input_spare(x.dtype()), mlp_spare = L.moe ? 0 : L.mlp.input_spare(x.dtype());
  auto [h, normed] = L.post_attention_layernorm.forward_residual(
      x, self_attention(L.self_attn, L.input_layernorm.forward(x, attn_spare), ctx, L.window, attn_spare), mlp_spare);
  // In a checkpoint's rerun nothing reads the layer's output: down's product (about a quarter of a
  // dense layer's products, a third of the experts') and the last add are recorded, not computed.
  // The residual add rides in down's GEMM (its C) where it can.
  const ag::OutputUse use = ctx.output_unread ? ag::OutputUse::kRootOnly : ag::OutputUse::kRead;
  return mlp(L, normed, ctx, use, mlp_spare, &h);
}

ag::Variable sandwich_block(const DecoderLayer& L, const ag::Variable& x, const LayerContext& ctx) {
  LOOM_CHECK(L.pre_feedforward_layernorm && L.post_feedforward_layernorm,
             "sandwich_block: the family's weight map lists no pre/post_feedforward_layernorm");
  const int64_t attn_spare = L.self_attn.input_spare(x.dtype()), mlp_spare = L.moe ? 0 : L.mlp.input_spare(x.dtype());
  ag::Variable a = self_attention(L.self_attn, L.input_layernorm.forward(x, attn_spare), ctx, L.window, attn_spare);
  ag::Variable h = ag::add(x, L.post_attention_layernorm.forward(a));
  ag::Variable m = mlp(L, L.pre_feedforward_layernorm->forward(h, mlp_spare), ctx, ag::OutputUse::kRead, mlp_spare);
  return ag::add(h, L.post_feedforward_layernorm->forward(m));
}

}  // namespace loom::detail
