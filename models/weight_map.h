// A family's weight map applied to tensor names: where each of Loom's tensors lives in a Hugging
// Face checkpoint (a whole tensor, or rows of a fused one), Loom's weights gathered back into Hugging
// Face tensors (fused parts concatenated), and the Hugging Face <-> llama.cpp GGUF names.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/family.h"

namespace loom {
class CausalLM;

// Where one of Loom's tensors comes from: the Hugging Face tensor `name`, whole (total_rows == 0) or
// rows [row0, row0 + rows) of a fused tensor of total_rows rows.
struct HfSource {
  std::string name;
  int64_t row0 = 0, rows = 0, total_rows = 0;
  bool part() const { return total_rows > 0; }
};
// `loom_name` is Loom's tensor name ("model.layers.3.self_attn.q_proj.weight"). InternalError when
// the family's map has no rule for it (a bug in the family's spec, not the user's input).
absl::StatusOr<HfSource> hf_source(const FamilySpec& family, const ModelConfig& config, const std::string& loom_name);

// The model's weights under Hugging Face names, in model order: Loom's tensors as they are, and the
// parts of a fused Hugging Face tensor concatenated back along rows (on the weights' device). A
// tied lm_head appears only as the embedding, and 4-bit (NF4) Linear weights not at all. Stacked
// experts become the hub's per-expert tensors (hf_expert_tensors), or with `stacked_experts` stay as
// Loom (and transformers 5.x in memory) holds them: "model.layers.3.mlp.experts.gate_up_proj", ...
absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> hf_state_dict(const CausalLM& model,
                                                                         bool stacked_experts = false);

// Loom's stacked experts ("model.layers.3.mlp.experts.gate_up_proj" [E, 2 I, H], ".down_proj" [E, H, I])
// as the per-expert Hugging Face tensors of the family's hub layout (views of t), which
// transformers' save_pretrained writes too; nullopt for any other name.
std::optional<std::vector<std::pair<std::string, Tensor>>> hf_expert_tensors(const ModelConfig& config,
                                                                             const std::string& loom_name,
                                                                             const Tensor& t);

// One tensor's name on the other side and what convert_hf_to_gguf.py did to it.
struct GgufMapping {
  std::string name;
  GgufFix fix = GgufFix::kNone;
};
// "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight" (and back); nullopt when the name
// has no counterpart in this family's map.
std::optional<GgufMapping> gguf_to_hf(const FamilySpec& family, const std::string& gguf_name);
std::optional<GgufMapping> hf_to_gguf(const FamilySpec& family, const std::string& hf_name);

// llama.cpp's stacked experts (tools/reference/moe_formats.md (e)). Loom's "model.layers.3.mlp.experts.gate_up_proj"
// [E, 2 I, H] as "blk.3.ffn_gate_exps.weight" (each expert's rows [0, I)) and "blk.3.ffn_up_exps.weight"
// (rows [I, 2 I)), both [E, I, H]; ".down_proj" [E, H, I] as "blk.3.ffn_down_exps.weight". Views of t,
// in torch order (ggml's ne is the shape reversed: {H, I, E}, {I, H, E}); nullopt for other names.
std::optional<std::vector<std::pair<std::string, Tensor>>> gguf_expert_tensors(const std::string& loom_name,
                                                                               const Tensor& t);
// The other way: "blk.3.ffn_gate_exps.weight" -> the family's per-expert Hugging Face name with "{e}" in
// place of the expert ("model.layers.3.block_sparse_moe.experts.{e}.w1.weight"); nullopt for other
// names and for families without experts.
std::optional<std::string> hf_expert_name_from_gguf(const FamilySpec& family, const std::string& gguf_name);

}  // namespace loom
