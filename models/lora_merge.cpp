// Folding LoRA adapters into the base weights, and writing the merged model as a Hugging Face
// folder (see lora.h).
#include "models/lora.h"

#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/json_file.h"
#include "engine/tensor_io.h"
#include "engine/text_file.h"
#include "models/finite_check.h"
#include "models/gguf_model.h"
#include "models/lora_experts.h"
#include "models/weight_map.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace fs = std::filesystem;

void merge_lora(CausalLM& model) {
  detail::merge_expert_lora(model);
  for (Linear* l : model.linears()) {
    if (!l->lora && !l->quantized()) continue;
    // A 4-bit weight is dequantised (QLoRA merges into a dense model in the model's dtype).
    const DType dtype = l->quantized() ? model.dtype() : l->weight.dtype();
    Tensor base = l->dense_weight(DType::f32);
    l->nf4.reset();
    l->weight_spare = 0;  // the merged weight below is contiguous
    if (!l->lora) {
      l->weight = ag::Variable(base.to(dtype), false);
      continue;
    }
    // [out, in] = scale * B [out, r] x A [r, in], added in f32, rounded once to the weight dtype.
    Tensor delta = ops::matmul(l->lora->B.value(), l->lora->A.value());
    Tensor merged = ops::axpby(base, delta, 1.f, l->lora->scale);
    l->weight = ag::Variable(merged.to(dtype), false);
    l->lora.reset();
  }
}

absl::Status save_pretrained(const CausalLM& model, const std::string& out_dir) {
  const fs::path tmp(out_dir);  // each file below is written to a temporary name and renamed
  std::error_code ec;
  // A sharded model's index beside the new single file would be loaded instead of it.
  if (fs::exists(tmp / "model.safetensors.index.json", ec))
    return absl::AlreadyExistsError(absl::StrCat(out_dir, " holds a sharded model (model.safetensors.index.json): a model ",
                                                 "written there would not be the one loaded; choose another folder"));
  if (absl::Status s = create_folder(tmp.string()); !s.ok()) return s;
  for (const Linear* l : model.linears())
    if (l->quantized())
      return absl::FailedPreconditionError(absl::StrCat(l->name, " is 4-bit: merge_lora() dequantises before saving a ",
                                                        "full-precision model (loom merge does)"));
  auto tensors = hf_state_dict(model);  // fused Hugging Face tensors concatenated back from Loom's parts
  if (!tensors.ok()) return tensors.status();
  if (absl::Status s = check_finite_to_save(*tensors, (tmp / "model.safetensors").string()); !s.ok()) return s;
  if (absl::Status s = save_tensors((tmp / "model.safetensors").string(), *tensors, DType::bf16, {{"format", "pt"}}); !s.ok())
    return s;
  nlohmann::json config;
  if (is_gguf_path(model.source_dir())) {  // a model loaded from a .gguf: its config rebuilt from the metadata
    auto gguf = GgufFile::open(model.source_dir());
    if (!gguf.ok()) return gguf.status();
    auto j = gguf_hf_config(*gguf);
    if (!j.ok()) return j.status();
    config = *std::move(j);
  } else {
    auto j = read_json_file((fs::path(model.source_dir()) / "config.json").string());
    if (!j.ok()) return j.status();
    config = *std::move(j);
  }
  // A multimodal source is written as its language model alone (the weights written are only those).
  config = ModelConfig::language_model_json(config, *model.config().family);
  config["dtype"] = "bfloat16";
  if (config.contains("torch_dtype")) config["torch_dtype"] = "bfloat16";
  config.erase("quantization_config");  // the weights written here are dense (a 4-bit source was dequantised)
  if (absl::Status s = write_text_atomic((tmp / "config.json").string(), config.dump(2) + "\n"); !s.ok()) return s;
  // The files that make the folder a complete Hugging Face model besides the weights (tokenizer.model
  // and added_tokens.json too: `loom export` of the merged folder then writes the GGUF vocabulary the
  // source folder gives; chat_template.jinja: where transformers 5 keeps the chat template).
  for (const char* extra : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                            "tokenizer.model", "added_tokens.json", "chat_template.jinja"}) {
    const fs::path src = fs::path(model.source_dir()) / extra;
    if (!fs::exists(src) || fs::equivalent(src.parent_path(), tmp, ec)) continue;
    const fs::path part = tmp / absl::StrCat(extra, ".tmp.", getpid());
    fs::copy_file(src, part, fs::copy_options::overwrite_existing, ec);
    if (!ec) fs::rename(part, tmp / extra, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot copy ", src.string(), " to ", out_dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace loom
