// Internal to models/: loads a CausalLM's modules by Loom's names through the family's weight map
// (a Hugging Face tensor as it is, or rows of a fused one), with shape checks, bitsandbytes 4-bit
// weights kept 4-bit, QLoRA quantisation as weights load, and a record of every tensor consumed.
// Without a checkpoint it initialises instead: N(0, 0.02) matrices, zero biases, unit norms ((1 + w) norms: 0).
#pragma once
#include <cmath>
#include <optional>
#include <set>
#include <string>

#include "models/bnb_checkpoint.h"
#include "models/checkpoint.h"
#include "models/family.h"
#include "models/layers.h"
#include "models/weight_map.h"

namespace loom::detail {

class WeightLoader {
 public:
  WeightLoader(const ModelConfig& config, const Checkpoint* ck, DType dtype, Device device, uint64_t seed,
               bool quantize_4bit, std::optional<BnbQuantConfig> bnb)
      : config_(config), family_(*config.family), ck_(ck), dtype_(dtype), device_(device), seed_(seed),
        quantize_4bit_(quantize_4bit), bnb_(std::move(bnb)) {
    choose_layout();
  }

  // Where the tensors loaded from now on go (a --device-map run places each layer on its own).
  void set_device(Device device) { device_ = device; }
  // Loom's tensor `name` ("model.embed_tokens.weight") of `shape`; init_fill: the value without a
  // checkpoint (NaN: random normal).
  absl::StatusOr<ag::Variable> get(const std::string& name, const Shape& shape, float init_fill = NAN);
  // Loom's module `name` ("model.layers.0.self_attn.q_proj"), [out, in] (+ bias [out]).
  // norm_reader: the projection reads a norm's output; its dense bf16 weight then gets the adapter
  // room set by set_adapter_room (LoadOptions::adapter_room).
  absl::Status linear(Linear& l, const std::string& name, int64_t out, int64_t in, bool bias, bool norm_reader = false);
  void set_adapter_room(int64_t columns) { adapter_room_ = columns; }
  absl::Status norm(RmsNorm& n, const std::string& name, int64_t dim);
  // A mixture-of-experts projection stacked over `experts`: [experts, sum of part_rows, cols]. Each
  // expert e's rows are its parts' tensors one after another, the Hugging Face names of `parts` with
  // "{e}" replaced by e ("model.layers.0.block_sparse_moe.experts.{e}.w1.weight", then ...w3.weight:
  // gate rows, then up rows, as transformers 5.x fuses them), as hub checkpoints and transformers'
  // save_pretrained write them. `fused`: the same tensor as transformers 5.x names it in memory
  // ("model.layers.0.mlp.experts.gate_up_proj", written by save_original_format=False), read instead
  // when the checkpoint has it. Without a checkpoint: N(0, 0.02).
  absl::StatusOr<ag::Variable> experts(const std::vector<std::string>& parts, const std::vector<int64_t>& part_rows,
                                       int64_t experts, int64_t cols, const std::string& fused);
  // A mixture-of-experts layer's MLP under `prefix` ("model.layers.0."): the router and the experts
  // through the family's MoeSpec, stacked (and quantised to NF4 per expert with quantize_4bit).
  absl::Status moe(MoeMlp& m, const std::string& prefix);
  // Where a Hugging Face tensor of the language model sits in this checkpoint (the family's
  // checkpoint layout: "model.norm.weight" -> "language_model.model.norm.weight"); itself otherwise.
  std::string checkpoint_name(const std::string& hf_name) const;
  // Marks a checkpoint tensor the model does not need as read (lm_head's copy in a tied model).
  void mark_consumed(const std::string& ck_name) { consumed_.insert(ck_name); }
  // InvalidArgument naming the checkpoint tensors nothing consumed; tensors under the family's
  // skipped prefixes are not counted, and `notes` gets one line saying how many were left out.
  absl::Status check_unexpected(std::vector<std::string>* notes) const;

 private:
  // The model's one scratch for its NF4 experts' dequantised weights (models/dequant_scratch.h).
  std::shared_ptr<DequantScratch> dequant_scratch_ = std::make_shared<DequantScratch>();
  int64_t adapter_room_ = 0;
  absl::StatusOr<Tensor> load_part(const HfSource& src, const Shape& shape);
  void choose_layout();

  const ModelConfig& config_;
  const FamilySpec& family_;
  const Checkpoint* ck_;
  DType dtype_;
  Device device_;
  uint64_t seed_;
  bool quantize_4bit_;
  std::optional<BnbQuantConfig> bnb_;
  std::set<std::string> consumed_;
  const FamilySpec::CheckpointLayout* layout_ = nullptr;  // null: names as they are
  // The last fused Hugging Face tensor read, whose parts are usually asked for one after another.
  std::string fused_name_;
  Tensor fused_;
};

}  // namespace loom::detail
