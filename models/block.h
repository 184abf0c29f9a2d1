// Internal to models/: what one decoder layer needs at run time, and the shared builders a family's
// block forward is made of (as llama.cpp's src/models/<arch>.cpp wire build_norm / build_attn /
// build_ffn): self-attention with RoPE, and the two block shapes the supported families use.
#pragma once
#include "models/config.h"
#include "models/layers.h"

namespace loom::detail {

struct LayerContext {
  const ModelConfig* config = nullptr;
  int64_t batch = 0, seq = 0;
  Tensor positions;  // i32 [batch*seq]
  Tensor inv_freq;   // f32 [rotary_dim/2]: the RoPE table of this layer's type (full or sliding)
  float rope_mscale = 1.f;  // LongRoPE's attention scaling of cos and sin
  int64_t max_position = -1;  // the largest position of this forward (LongRoPE's choice of factors)
  Tensor segment_ids;
  // Generation: this layer's KV cache [1, capacity, kv_heads, head_dim] and where the new tokens go.
  Tensor* k_cache = nullptr;
  Tensor* v_cache = nullptr;
  int64_t cache_start = 0;
  // Mixture-of-experts layers append what their router chose (for the load-balancing loss) when set.
  std::vector<RouterOutput>* routers = nullptr;
  // Nothing reads the block's output value, only its gradient starts there: backward's
  // recomputation of a checkpointed layer. A block may then skip the work that only makes it.
  bool output_unread = false;
};

// The layer's MLP on h [batch, seq, hidden]: the dense one, or the mixture of experts (which
// reports its router to ctx.routers).
// x_spare: h's spare columns (RmsNorm::forward's spare, Mlp::input_spare), dense MLPs only. With
// residual: residual + the MLP's output (a dense MLP's down projection adds it in its GEMM).
ag::Variable mlp(const DecoderLayer& layer, const ag::Variable& h, const LayerContext& ctx,
                 ag::OutputUse use = ag::OutputUse::kRead, int64_t x_spare = 0, const ag::Variable* residual = nullptr);

// Grouped-query self-attention with RoPE, and whatever optional parts the layer has: q/k norms
// (present when the family's weight map lists them), the config's soft-cap and query scale, the
// layer's sliding window. h [batch, seq, hidden] -> [batch, seq, hidden].
// x_spare: h's spare columns (Attention::input_spare) for the projections' adapters.
ag::Variable self_attention(const Attention& attn, const ag::Variable& h, const LayerContext& ctx, int64_t window,
                            int64_t x_spare = 0);

// The pre-norm block (Llama, and every family built on it):
//   x = x + attention(input_layernorm(x));  x = x + mlp(post_attention_layernorm(x))
// With ctx.output_unread the MLP's down projection (dense, or the experts' with their sum) and the
// last residual add are recorded for backward without being computed (nothing after them needs
// their values).
ag::Variable prenorm_block(const DecoderLayer& layer, const ag::Variable& x, const LayerContext& ctx);
// The "sandwich" block (Gemma 2): attention and MLP each between two norms:
//   x = x + post_attention_layernorm(attention(input_layernorm(x)))
//   x = x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))
ag::Variable sandwich_block(const DecoderLayer& layer, const ag::Variable& x, const LayerContext& ctx);

}  // namespace loom::detail
