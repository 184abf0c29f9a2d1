// Gemma and Gemma 2 decoder layers. Gemma is the Llama layer with (1 + w) norms and a tanh-GELU
// gated MLP (both set at load time). Gemma 2 wraps attention and MLP in "sandwich" norms:
//   x = x + post_attention_norm(attention(input_norm(x)))
//   x = x + post_feedforward_norm(mlp(pre_feedforward_norm(x)))
#include "models/family.h"

namespace loom::detail {

ag::Variable gemma_layer(const DecoderLayer& L, const ag::Variable& x, const LayerContext& ctx) {
  if (!L.pre_feedforward_layernorm) return llama_layer(L, x, ctx);  // Gemma (1)
  ag::Variable a = self_attention(L.self_attn, L.input_layernorm.forward(x), ctx, L.window);
  ag::Variable h = ag::add(x, L.post_attention_layernorm.forward(a));
  ag::Variable m = L.mlp.forward(L.pre_feedforward_layernorm->forward(h));
  return ag::add(h, L.post_feedforward_layernorm->forward(m));
}

}  // namespace loom::detail
