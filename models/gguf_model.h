// A llama.cpp GGUF model seen as the Hugging Face checkpoint it was converted from: config.json
// rebuilt from the GGUF metadata, tensors renamed to Hugging Face names, dequantised to f32, with
// convert_hf_to_gguf.py's changes undone (the q/k row permutation of llama, gemma's norm + 1).
#pragma once
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "engine/gguf.h"
#include "engine/tensor.h"
#include "models/config.h"
#include "models/family.h"
#include "nlohmann/json.hpp"

namespace loom {

// llama.cpp's LongRoPE factor tensors (f32 [rotary_dim / 2]), read into and written from config.json's
// rope_scaling.long_factor / short_factor.
inline constexpr const char* kRopeFactorsLong = "rope_factors_long.weight";
inline constexpr const char* kRopeFactorsShort = "rope_factors_short.weight";


// True when `path` names a .gguf file (not a folder).
bool is_gguf_path(const std::string& path);

// config.json as transformers would write it for this GGUF's `general.architecture` (the families
// whose spec reads one). Errors name the file and the metadata key: a missing required key, an
// architecture or RoPE scaling Loom does not implement, per-layer head counts.
absl::StatusOr<nlohmann::json> gguf_hf_config(const GgufFile& file);

// Every tensor under its Hugging Face name as an f32 CPU tensor in Hugging Face layout; llama.cpp's
// stacked experts (blk.<i>.ffn_{gate,up,down}_exps) as the hub's per-expert tensors (views of the
// stack), as transformers' save_pretrained writes them. A GGUF tensor with no Hugging Face
// counterpart is an error naming it.
absl::StatusOr<std::map<std::string, Tensor>> gguf_hf_tensors(const GgufFile& file, const ModelConfig& config);

// generation_config.json from the tokenizer ids in the metadata.
nlohmann::json gguf_generation_config(const GgufFile& file);

struct GgufModel {
  nlohmann::json config_json;
  ModelConfig config;
  std::map<std::string, Tensor> tensors;
};
absl::StatusOr<GgufModel> load_gguf_model(const std::string& path);

// GGUF tensor name -> Hugging Face name ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight");
// "" when the name has no counterpart for this family.
std::string gguf_to_hf_name(const std::string& gguf_name, const FamilySpec& family);
// Undoes convert_hf_to_gguf.py's LlamaModel.permute on rows: the file's rows, per head, are
// (head_dim/2, 2) where Hugging Face's are (2, head_dim/2). `t` is [n_head * head_dim] or
// [n_head * head_dim, in], f32, contiguous.
Tensor unpermute_rope_rows(const Tensor& t, int64_t n_head);
// What convert_hf_to_gguf.py did to a tensor (f32, contiguous, on the CPU), done or undone.
Tensor do_gguf_fix(Tensor t, GgufFix fix, const ModelConfig& config);
Tensor undo_gguf_fix(Tensor t, GgufFix fix, const ModelConfig& config);

}  // namespace loom
