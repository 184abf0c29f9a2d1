// CausalLM -> GGUF tensors and hyper-parameters, following convert_hf_to_gguf.py and gguf-py's key
// names (the shared ones here, the family's through its spec), so llama.cpp loads the file as it
// would its own conversion of the same Hugging Face folder.
#include "models/gguf_export.h"

#include <algorithm>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "models/family.h"
#include "models/finite_check.h"
#include "models/gguf_model.h"
#include "models/weight_map.h"

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

// "base 10000, linear x8" (what the error messages show of a RoPE).
std::string describe(const RopeParams& r) {
  std::string s = absl::StrCat("base ", r.theta);
  if (r.scaling.kind == RopeScaling::Kind::kDefault) return s + ", unscaled";
  absl::StrAppend(&s, ", ", rope_kind_name(r.scaling.kind));
  if (r.scaling.kind == RopeScaling::Kind::kLinear) absl::StrAppend(&s, " x", r.scaling.factor);
  return s;
}

// convert_hf_to_gguf.py's choice: matrices (expert stacks too) of the file's type, except the MoE
// router (ffn_gate_inp, always F32 there and in llama-quant.cpp); norms and vectors F32; Q8_0 rows that
// are not whole blocks F16.
GgmlType tensor_type(const std::string& gguf_name, int64_t dim, int64_t row, GgmlType matrix_type) {
  if (dim < 2 || gguf_name.ends_with("_norm.weight") || gguf_name.ends_with(".ffn_gate_inp.weight")) return GgmlType::F32;
  return matrix_type == GgmlType::Q8_0 && row % kQK != 0 ? GgmlType::F16 : matrix_type;
}

}  // namespace

absl::StatusOr<std::string> gguf_architecture(const FamilySpec& family) {
  if (!family.gguf_write_arch.empty()) return family.gguf_write_arch;
  return absl::UnimplementedError(
      absl::StrCat("GGUF export: ", family.name, " models are not supported yet (",
                   family_names([](const FamilySpec& s) { return !s.gguf_write_arch.empty(); }), " are)"));
}

std::string hf_to_gguf_name(const std::string& hf, const FamilySpec& family) {
  auto m = hf_to_gguf(family, hf);
  return m ? m->name : "";
}

std::string gguf_export_warning(const ModelConfig& config) {
  return config.family->gguf_export_warning ? config.family->gguf_export_warning(config) : "";
}

absl::Status add_gguf_model(const CausalLM& model, GgmlType matrix_type, const std::string& name, GgufWriter& w) {
  const ModelConfig& c = model.config();
  auto arch_or = gguf_architecture(*c.family);
  if (!arch_or.ok()) return arch_or.status();
  const std::string arch = *arch_or, p = arch + ".";
  // No metadata key holds a second RoPE: sliding-window layers get the architecture's own (or the
  // full layers').
  const RopeParams sliding_rope = c.family->gguf_sliding_rope.value_or(c.rope);
  if (std::find(c.layer_is_sliding.begin(), c.layer_is_sliding.end(), true) != c.layer_is_sliding.end() &&
      !(c.rope_sliding == sliding_rope))
    return absl::UnimplementedError(absl::StrCat("GGUF export: llama.cpp's ", arch, " gives sliding-window layers RoPE ",
                                                 describe(sliding_rope), "; this model's sliding layers have ",
                                                 describe(c.rope_sliding)));
  if (c.family->gguf_export_check)
    if (absl::Status s = c.family->gguf_export_check(c); !s.ok()) return s;
  if (c.rope.scaling.kind == RopeScaling::Kind::kLlama3)
    return absl::UnimplementedError(
        "GGUF export: Llama 3.1 RoPE scaling (rope_type llama3) needs llama.cpp's rope_freqs tensor, which Loom "
        "does not write yet");
  if (matrix_type != GgmlType::F32 && matrix_type != GgmlType::F16 && matrix_type != GgmlType::BF16 &&
      matrix_type != GgmlType::Q8_0)
    return absl::InvalidArgumentError(absl::StrCat("GGUF export: cannot write ", ggml_type_name(matrix_type)));
  // A 4-bit weight has no dense tensor to write (hf_state_dict leaves it out).
  std::string nf4;
  for (const Linear* l : model.linears())
    if (l->quantized() && nf4.empty()) nf4 = l->name;
  for (const ExpertLinear* e : model.expert_linears())
    if (e->quantized() && nf4.empty()) nf4 = e->name;
  if (!nf4.empty())
    return absl::FailedPreconditionError(absl::StrCat("GGUF export: ", nf4, " is 4-bit (NF4); load the model in 16 or ",
                                                      "32 bits, or merge_lora() it first (loom merge does)"));

  w.add("general.architecture", gguf_string(arch));
  w.add("general.type", gguf_string("model"));
  w.add("general.name", gguf_string(name));
  w.add(p + "block_count", gguf_u32(static_cast<uint32_t>(c.num_hidden_layers)));
  w.add(p + "context_length", gguf_u32(static_cast<uint32_t>(c.max_position_embeddings)));
  w.add(p + "embedding_length", gguf_u32(static_cast<uint32_t>(c.hidden_size)));
  w.add(p + "feed_forward_length", gguf_u32(static_cast<uint32_t>(c.intermediate_size)));
  w.add(p + "attention.head_count", gguf_u32(static_cast<uint32_t>(c.num_attention_heads)));
  w.add(p + "attention.head_count_kv", gguf_u32(static_cast<uint32_t>(c.num_key_value_heads)));
  w.add(p + "rope.freq_base", gguf_f32(static_cast<float>(c.rope.theta)));
  w.add(p + "attention.layer_norm_rms_epsilon", gguf_f32(static_cast<float>(c.rms_norm_eps)));
  if (c.head_dim * c.num_attention_heads != c.hidden_size) {
    w.add(p + "attention.key_length", gguf_u32(static_cast<uint32_t>(c.head_dim)));
    w.add(p + "attention.value_length", gguf_u32(static_cast<uint32_t>(c.head_dim)));
  }
  if (c.family->config_to_gguf) c.family->config_to_gguf(c, p, w);
  if (c.rope.scaling.kind == RopeScaling::Kind::kLinear) {
    w.add(p + "rope.scaling.type", gguf_string("linear"));
    w.add(p + "rope.scaling.factor", gguf_f32(static_cast<float>(c.rope.scaling.factor)));
  }
  if (c.rope.scaling.kind == RopeScaling::Kind::kLongRope) {  // as convert_hf_to_gguf.py's Phi3MiniModel
    for (const auto& [name, factors] : {std::pair{kRopeFactorsLong, &c.rope.scaling.long_factor},
                                        std::pair{kRopeFactorsShort, &c.rope.scaling.short_factor}}) {
      std::vector<float> v(factors->begin(), factors->end());
      w.add_tensor(name, Tensor::from_floats(v, {static_cast<int64_t>(v.size())}), GgmlType::F32);
    }
  }
  w.add("general.file_type", gguf_u32(file_type(matrix_type)));
  w.add("general.quantization_version", gguf_u32(2));

  // Fused Hugging Face tensors concatenated back from Loom's parts; experts stacked, as llama.cpp keeps them.
  auto tensors = hf_state_dict(model, /*stacked_experts=*/true);
  if (!tensors.ok()) return tensors.status();
  for (auto& [hf, value] : *tensors) {
    std::vector<std::pair<GgufMapping, Tensor>> outs;  // one tensor, or a stack split into gate, up (down)
    if (auto experts = gguf_expert_tensors(hf, value)) {
      for (auto& [name, t] : *experts) outs.push_back({GgufMapping{name}, std::move(t)});
    } else if (const auto g = hf_to_gguf(*c.family, hf)) {
      outs.push_back({*g, value});
    } else {
      return absl::UnimplementedError(absl::StrCat("GGUF export: no llama.cpp name for tensor '", hf, "'"));
    }
    for (auto& [g, part] : outs) {
      Tensor t = part.to(Device::cpu(), DType::f32).contiguous();
      if (t.storage() == value.storage()) t = t.clone();  // never alias the live weight
      // Nothing non-finite reaches disk (before the writer creates the file).
      if (absl::Status s = check_finite(t, "refusing to write the GGUF file", hf,
                                        ": training diverged or the weights were damaged; nothing was written");
          !s.ok())
        return absl::FailedPreconditionError(s.message());
      t = do_gguf_fix(std::move(t), g.fix, c);
      const GgmlType type = tensor_type(g.name, t.dim(), t.size(-1), matrix_type);
      w.add_tensor(g.name, std::move(t), type);
    }
  }
  return absl::OkStatus();
}

}  // namespace loom
