// Placing a model over devices (`--device-map`, `--max-memory`, with accelerate's meanings): the
// model in units (the embedding, each decoder layer, the final norm, the lm_head), each unit's
// bytes for a training run (its weights in their storage format, NF4 included; its LoRA or full
// fine-tuning state; what the checkpointing mode keeps of its activations), and a device for each:
//   sequential  fill cuda:0 up to its cap, then cuda:1, ..., then the CPU (layers there are streamed
//               to the GPU a layer ahead);
//   balanced    the same with each GPU's share cut to an even split of the model (plus its largest
//               unit), so that every GPU takes part;
//   auto        balanced over several GPUs, sequential over one;
//   FILE.json   accelerate's device_map: {"model.embed_tokens": 0, "model.layers.0": "cpu", ...},
//               a key standing for every unit it is a dotted prefix of ("model.layers": 1).
// In a GPU run the embedding, the final norm and lm_head stay on GPUs; the layers on "cpu" run on the
// GPU of the final norm, which keeps their trainable state, activations and two staging slots.
// A plan that cannot fit is refused with what would make it fit.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/device.h"
#include "engine/dtype.h"
#include "models/config.h"
#include "models/placement.h"
#include "nlohmann/json.hpp"
#include "train/checkpointing_plan.h"

namespace loom {

// `--max-memory cuda:0=20GiB,cuda:1=20GiB,cpu=100GiB` (also "0=20GiB"; units B, KB, MB, GB, TB
// (powers of 1000) and KiB, MiB, GiB, TiB (of 1024), as accelerate reads them).
struct MemoryCaps {
  std::map<int, int64_t> gpu;  // GPU index -> bytes
  std::optional<int64_t> cpu;
};
absl::StatusOr<MemoryCaps> parse_max_memory(const std::string& text);
// "20GiB" -> 21474836480.
absl::StatusOr<int64_t> parse_bytes(const std::string& text);

struct PlanUnit {
  std::string name;  // "model.embed_tokens", "model.layers.3", "model.norm", "lm_head"
  int64_t weight_bytes = 0;  // as stored (NF4: half a byte a weight and its scales)
  int64_t state_bytes = 0;   // trainable state: LoRA (or, --full, every weight's) master, gradient, AdamW moments
  int64_t activation_bytes = 0;  // what the checkpointing mode keeps of this unit's activations until backward
  // lm_head of a model whose head is its embedding (tie_word_embeddings): it runs where the embedding
  // is, whatever a strategy or map says (accelerate keeps tied parameters together too).
  bool tied_to_embedding = false;
  int64_t bytes() const { return weight_bytes + state_bytes + activation_bytes; }
};

struct PlanOptions {
  DType weight_dtype = DType::bf16;  // the dense weights' dtype
  DType activation_dtype = DType::bf16;
  bool qlora = false;                // decoder Linear weights in NF4
  bool full = false;                 // every weight trained (16 bytes of state each)
  int64_t lora_r = 16;
  std::vector<std::string> lora_targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  Checkpointing checkpointing = Checkpointing::kNone;
  int64_t tokens = 0;                // rows x sequence length of a micro-batch
};
// The units of `config` in model order, sized for a run with `options`.
std::vector<PlanUnit> plan_units(const ModelConfig& config, const PlanOptions& options);

struct DevicePlan {
  std::string strategy;                                  // "sequential", "balanced", or the JSON file
  std::vector<std::pair<std::string, Device>> placement; // unit -> device, in model order
  std::map<std::string, int64_t> bytes;                  // device name -> bytes placed there
  // Working memory each GPU needs besides its units (a layer's activations while it runs or is
  // recomputed, the fused loss's chunk): counted in `bytes`.
  int64_t working_bytes = 0;
  // Two staging buffers of the largest streamed layer on the GPU that runs them (0: none streamed).
  int64_t stream_slot_bytes = 0;
  // One line per device: its units (layer ranges) and bytes against its cap.
  std::string describe(const MemoryCaps& caps) const;
  nlohmann::json to_json() const;  // accelerate's device_map format
  // What the model loads with: a GPU run's layers on "cpu" are streamed to the GPU of the final norm.
  Placement to_placement() const;
};

// `map` is "auto", "balanced", "sequential" or a JSON file; `gpus` the visible GPU count (0: the
// CPU alone). Caps absent from `caps` are `available` (device name -> free bytes).
absl::StatusOr<DevicePlan> plan_devices(const std::vector<PlanUnit>& units, const std::string& map, const MemoryCaps& caps,
                                        int gpus, const std::map<std::string, int64_t>& available,
                                        int64_t working_bytes);

}  // namespace loom
