// Internal to models/: what one decoder layer needs at run time, and the per-family layer
// functions (models/llama.cpp: Llama, Mistral, Qwen2, Qwen3; models/gemma.cpp: Gemma, Gemma 2).
#pragma once
#include "models/config.h"
#include "models/layers.h"

namespace loom::detail {

struct LayerContext {
  const ModelConfig* config = nullptr;
  int64_t batch = 0, seq = 0;
  Tensor positions;  // i32 [batch*seq]
  Tensor inv_freq;   // f32 [head_dim/2]
  Tensor segment_ids;
  // Generation: this layer's KV cache [1, capacity, kv_heads, head_dim] and where the new tokens go.
  Tensor* k_cache = nullptr;
  Tensor* v_cache = nullptr;
  int64_t cache_start = 0;
};

// Grouped-query self-attention with RoPE (and Qwen3's q/k norms, Gemma 2's soft-capping and
// sliding windows), shared by all families. h [batch, seq, hidden] -> [batch, seq, hidden].
ag::Variable self_attention(const Attention& attn, const ag::Variable& h, const LayerContext& ctx, int64_t window);

ag::Variable llama_layer(const DecoderLayer& layer, const ag::Variable& x, const LayerContext& ctx);
ag::Variable gemma_layer(const DecoderLayer& layer, const ag::Variable& x, const LayerContext& ctx);

}  // namespace loom::detail
