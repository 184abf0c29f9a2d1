// CausalLM -> GGUF tensors and hyper-parameters, following convert_hf_to_gguf.py (LlamaModel,
// Qwen2Model, Qwen3Model) and gguf-py's key names, so llama.cpp loads the file as it would its own
// conversion of the same Hugging Face folder.
#include "models/gguf_export.h"

#include <algorithm>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "models/finite_check.h"
#include "models/gguf_model.h"

namespace loom {
namespace {

// llama.cpp's LLAMA_FTYPE for a file whose matrices are all of one type.
uint32_t file_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 0;
    case GgmlType::F16: return 1;
    case GgmlType::Q8_0: return 7;
    case GgmlType::BF16: return 32;
    default: return 0;
  }
}

}  // namespace

absl::StatusOr<std::string> gguf_architecture(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama: case ModelFamily::kMistral: return std::string("llama");
    case ModelFamily::kQwen2: return std::string("qwen2");
    case ModelFamily::kQwen3: return std::string("qwen3");
    default:
      return absl::UnimplementedError(absl::StrCat("GGUF export: ", model_type_name(family),
                                                   " models are not supported yet (llama, mistral, qwen2, qwen3 are)"));
  }
}

std::string hf_to_gguf_name(const std::string& hf, ModelFamily family) {
  static const std::map<std::string, std::string> kTop = {
      {"model.embed_tokens", "token_embd"}, {"model.norm", "output_norm"}, {"lm_head", "output"}};
  const size_t dot = hf.rfind('.');
  if (dot == std::string::npos) return "";
  const std::string stem = hf.substr(0, dot), suffix = hf.substr(dot);
  if (suffix != ".weight" && suffix != ".bias") return "";
  if (auto it = kTop.find(stem); it != kTop.end()) return it->second + suffix;
  constexpr std::string_view kPrefix = "model.layers.";
  if (!stem.starts_with(kPrefix)) return "";
  const std::string rest = stem.substr(kPrefix.size());
  const size_t d = rest.find('.');
  int layer;
  if (d == std::string::npos || !absl::SimpleAtoi(rest.substr(0, d), &layer) || layer < 0) return "";
  // The inverse of gguf_to_hf_name: search its table through a candidate of every llama.cpp name.
  for (const char* g : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
                        "ffn_norm", "attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"}) {
    const std::string candidate = absl::StrCat("blk.", layer, ".", g, suffix);
    if (gguf_to_hf_name(candidate, family) == hf) return candidate;
  }
  return "";
}

absl::Status add_gguf_model(const CausalLM& model, GgmlType matrix_type, const std::string& name, GgufWriter& w) {
  const ModelConfig& c = model.config();
  auto arch_or = gguf_architecture(c.family);
  if (!arch_or.ok()) return arch_or.status();
  const std::string arch = *arch_or, p = arch + ".";
  if (c.rope_scaling.kind == RopeScaling::Kind::kLlama3)
    return absl::UnimplementedError(
        "GGUF export: Llama 3.1 RoPE scaling (rope_type llama3) needs llama.cpp's rope_freqs tensor, which Loom "
        "does not write yet");
  if (matrix_type != GgmlType::F32 && matrix_type != GgmlType::F16 && matrix_type != GgmlType::BF16 &&
      matrix_type != GgmlType::Q8_0)
    return absl::InvalidArgumentError(absl::StrCat("GGUF export: cannot write ", ggml_type_name(matrix_type)));

  w.add("general.architecture", gguf_string(arch));
  w.add("general.type", gguf_string("model"));
  w.add("general.name", gguf_string(name));
  w.add(p + "block_count", gguf_u32(static_cast<uint32_t>(c.num_hidden_layers)));
  w.add(p + "context_length", gguf_u32(static_cast<uint32_t>(c.max_position_embeddings)));
  w.add(p + "embedding_length", gguf_u32(static_cast<uint32_t>(c.hidden_size)));
  w.add(p + "feed_forward_length", gguf_u32(static_cast<uint32_t>(c.intermediate_size)));
  w.add(p + "attention.head_count", gguf_u32(static_cast<uint32_t>(c.num_attention_heads)));
  w.add(p + "attention.head_count_kv", gguf_u32(static_cast<uint32_t>(c.num_key_value_heads)));
  w.add(p + "rope.freq_base", gguf_f32(static_cast<float>(c.rope_theta)));
  w.add(p + "attention.layer_norm_rms_epsilon", gguf_f32(static_cast<float>(c.rms_norm_eps)));
  if (c.head_dim * c.num_attention_heads != c.hidden_size) {
    w.add(p + "attention.key_length", gguf_u32(static_cast<uint32_t>(c.head_dim)));
    w.add(p + "attention.value_length", gguf_u32(static_cast<uint32_t>(c.head_dim)));
  }
  if (arch == "llama") {
    w.add(p + "vocab_size", gguf_u32(static_cast<uint32_t>(c.vocab_size)));
    w.add(p + "rope.dimension_count", gguf_u32(static_cast<uint32_t>(c.head_dim)));
  }
  if (c.rope_scaling.kind == RopeScaling::Kind::kLinear) {
    w.add(p + "rope.scaling.type", gguf_string("linear"));
    w.add(p + "rope.scaling.factor", gguf_f32(static_cast<float>(c.rope_scaling.factor)));
  }
  w.add("general.file_type", gguf_u32(file_type(matrix_type)));
  w.add("general.quantization_version", gguf_u32(2));

  for (const auto& [hf, v] : model.named_weights()) {
    const std::string g = hf_to_gguf_name(hf, c.family);
    if (g.empty()) return absl::UnimplementedError(absl::StrCat("GGUF export: no llama.cpp name for tensor '", hf, "'"));
    Tensor t = v->value().to(Device::cpu(), DType::f32).contiguous();
    if (t.storage() == v->value().storage()) t = t.clone();  // never alias the live weight
    // Nothing non-finite reaches disk (before the writer creates the file).
    if (absl::Status s = check_finite(t, "refusing to write the GGUF file", hf,
                                      ": training diverged or the weights were damaged; nothing was written");
        !s.ok())
      return absl::FailedPreconditionError(s.message());
    if (arch == "llama") {
      if (g.find(".attn_q.") != std::string::npos) t = permute_rope_rows(t, c.num_attention_heads);
      if (g.find(".attn_k.") != std::string::npos) t = permute_rope_rows(t, c.num_key_value_heads);
    }
    GgmlType type = GgmlType::F32;
    if (t.dim() == 2 && !g.ends_with("_norm.weight")) {
      type = matrix_type;
      if (type == GgmlType::Q8_0 && t.size(1) % kQK != 0) type = GgmlType::F16;
    }
    w.add_tensor(g, std::move(t), type);
  }
  return absl::OkStatus();
}

}  // namespace loom
