// See device_map_flags.h.
#include "tools/device_map_flags.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "models/config.h"
#include "models/gguf_model.h"
#include "train/run_placement.h"

namespace loom::cli {

std::vector<FlagSpec> device_map_flags() {
  return {
      {"device-map", false,
       "place the model over devices (accelerate's device_map): auto, balanced, sequential or a JSON file; layers past "
       "the GPUs' caps stay in host memory and are streamed to the GPU a layer ahead",
       ""},
      {"max-memory", false, "caps for --device-map: cuda:0=20GiB,cuda:1=20GiB,cpu=100GiB", ""},
  };
}

absl::StatusOr<std::optional<Placement>> placement_from_flags(const Args& args, const std::string& model_path, DType dtype,
                                                              bool quiet) {
  if (!args.has("device-map")) {
    if (args.has("max-memory")) return absl::InvalidArgumentError("--max-memory caps the devices of a --device-map");
    return std::nullopt;
  }
  if (is_gguf_path(model_path))
    return absl::UnimplementedError(absl::StrCat("--device-map with a .gguf model (", model_path,
                                                 "): convert it to a Hugging Face folder first (loom convert)"));
  auto config = ModelConfig::load(model_path);
  if (!config.ok()) return config.status();
  PlanOptions o;
  o.weight_dtype = o.activation_dtype = dtype;
  o.lora_targets.clear();  // no trainable state: an adapter's weights are small beside the model
  o.tokens = 1;
  Checkpointing mode;
  // Nothing is kept for backward: the offload mode's accounting (no activation kept per layer).
  auto rp = plan_run_placement(*config, args.str("device-map"), args.str("max-memory"), o, Checkpointing::kOffload, &mode);
  if (!rp.ok()) return rp.status();
  if (!quiet) std::fprintf(stderr, "%s", rp->description.c_str());
  return rp->placement;
}

}  // namespace loom::cli
