// Pre-quantised Hugging Face checkpoints as transformers + bitsandbytes save them: config.json's
// `quantization_config`, and per 4-bit Linear weight W the tensors `W` (packed u8 [n/2, 1]),
// `W.absmax`, `W.quant_map`, `W.nested_absmax`, `W.nested_quant_map` and
// `W.quant_state.bitsandbytes__nf4` (u8 bytes of json.dumps of the non-tensor state).
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/checkpoint.h"
#include "models/nf4_weight.h"
#include "nlohmann/json.hpp"

namespace loom {

// config.json's "quantization_config" for quant_method "bitsandbytes", load_in_4bit.
struct BnbQuantConfig {
  std::string quant_type = "nf4";         // bnb_4bit_quant_type (only nf4 is supported)
  bool double_quant = true;               // bnb_4bit_use_double_quant
  std::string compute_dtype = "bfloat16"; // bnb_4bit_compute_dtype, torch's name ("bfloat16")
  std::string quant_storage = "uint8";    // bnb_4bit_quant_storage (only uint8 is supported)
  std::vector<std::string> skip_modules;  // llm_int8_skip_modules (null -> empty)

  // Whether transformers leaves the module dense: a skip entry equal to the module name, or a
  // dotted suffix/prefix of it (transformers' `key in name` rule, on whole name components).
  bool skips(const std::string& module_name) const;
};

// The quantization_config of a parsed config.json: nullopt when there is none; InvalidArgument
// naming `where` and the field for a bitsandbytes config Loom cannot load (8-bit, fp4, another
// quant_method, a quant_storage other than uint8, malformed values).
absl::StatusOr<std::optional<BnbQuantConfig>> parse_bnb_quant_config(const nlohmann::json& config,
                                                                    const std::string& where);
// model_dir/config.json read and parsed as above (NotFound when the file is missing).
absl::StatusOr<std::optional<BnbQuantConfig>> read_bnb_quant_config(const std::string& model_dir);
// The dict transformers' BitsAndBytesConfig.to_dict() writes into config.json.
nlohmann::json bnb_quant_config_json(const BnbQuantConfig& c);

// Whether transformers + bitsandbytes store the tensor `name` in 4 bits for the families Loom
// knows: the weight of a decoder Linear (q/k/v/o/gate/up/down_proj), never embeddings, norms,
// biases or lm_head (transformers keeps the output layer dense), and not a module `config` skips.
bool bnb_quantizes(const std::string& name, const BnbQuantConfig* config = nullptr);

// True when the checkpoint holds `weight_name` as a bitsandbytes 4-bit weight (its packed tensor
// is U8 and it has a `.quant_state.bitsandbytes__*` or `.absmax` companion).
bool is_nf4(const Checkpoint& ckpt, const std::string& weight_name);

// The tensors besides `weight_name` itself that a 4-bit weight may own in a checkpoint (for
// Checkpoint::check_unexpected's consumed set): .absmax, .quant_map, .nested_absmax,
// .nested_quant_map, .quant_state.bitsandbytes__nf4 / __fp4.
std::vector<std::string> nf4_companion_names(const std::string& weight_name);

// Loads the 4-bit weight `weight_name` onto `device` as it is stored (no dequantisation). Checks
// every companion tensor's presence, dtype and shape against the quant_state JSON and `expected`
// ([out, in]; empty: take the JSON's shape) and refuses what Loom cannot compute (fp4, a block size
// other than 64, a nested block size other than 256, a quant_map that is not NF4's), each with an
// InvalidArgument naming the tensor and the field.
absl::StatusOr<Nf4Weight> load_nf4(const Checkpoint& ckpt, const std::string& weight_name, const Shape& expected,
                                   Device device);

// The tensors bitsandbytes' Linear4bit._save_to_state_dict writes for `weight_name`, on the CPU, in
// its order: the packed weight [ceil(n/2), 1], absmax, quant_map, (nested_absmax,
// nested_quant_map,) and the quant_state JSON bytes.
std::vector<std::pair<std::string, Tensor>> nf4_state_tensors(const std::string& weight_name, const Nf4Weight& w);
// json.dumps of the quant_state's non-tensor items, byte for byte as bitsandbytes writes them.
std::string nf4_quant_state_json(const Nf4Weight& w);
// Python's repr() of a float (what json.dumps writes): shortest round-trip digits, scientific
// notation below 1e-4 and from 1e16 on.
std::string python_float_repr(double v);

}  // namespace loom
