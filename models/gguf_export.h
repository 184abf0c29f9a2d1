// A CausalLM written as llama.cpp's GGUF: its tensor names, convert_hf_to_gguf.py's q/k row
// permutation for the llama architecture, and the general.* / <arch>.* hyper-parameter metadata that
// llama.cpp reads (the tokenizer metadata comes from train/gguf_tokenizer_export.h).
#pragma once
#include <string>

#include "absl/status/status.h"
#include "engine/gguf_writer.h"
#include "models/causal_lm.h"

namespace loom {

// Hugging Face name -> llama.cpp name ("model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight");
// "" when llama.cpp has no counterpart for this family. The inverse of gguf_to_hf_name.
std::string hf_to_gguf_name(const std::string& hf_name, const FamilySpec& family);
// convert_hf_to_gguf.py's LlamaModel.permute: per head, Hugging Face's rows (2, head_dim/2) become
// the file's (head_dim/2, 2). The inverse of unpermute_rope_rows. f32, contiguous.
Tensor permute_rope_rows(const Tensor& t, int64_t n_head);
// general.architecture a family is written as (its spec's gguf_write_arch); Unimplemented when none.
absl::StatusOr<std::string> gguf_architecture(const FamilySpec& family);
// What the GGUF file will not keep of this model (e.g. mistral's sliding window), "" when nothing.
std::string gguf_export_warning(const ModelConfig& config);

// Adds general.* (architecture, name, file_type, quantization_version) and <arch>.* metadata and
// every weight of `model` (any dtype and device; copied to f32 on the CPU). Matrices are written as
// `matrix_type` (F32, F16, BF16 or Q8_0; a matrix whose rows are not whole Q8_0 blocks falls back to
// F16, as llama.cpp does); norms and biases stay F32. Unimplemented, before anything is added, for
// families without a GGUF architecture to write, for Llama 3.1 RoPE scaling (llama.cpp's rope_freqs
// tensor, which Loom's reader does not map back), for sliding-window layers whose RoPE is not the one
// the architecture gives them, and for what the family's gguf_export_check says its architecture
// cannot hold (gemma3: a layer pattern other than every 6th layer full, ...; qwen3_moe: norm_topk_prob
// false or dense layers). Mixture-of-experts layers are written as llama.cpp's stacked experts
// (ffn_gate_exps, ffn_up_exps, ffn_down_exps of the matrix type; the router ffn_gate_inp F32).
// FailedPrecondition for a model with 4-bit (NF4) weights, which have no dense tensor to write.
absl::Status add_gguf_model(const CausalLM& model, GgmlType matrix_type, const std::string& name, GgufWriter& w);

}  // namespace loom
