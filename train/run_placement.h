// `--device-map` / `--max-memory` for one run (loom train, forward, generate): the planner
// (device_plan.h) fed with the visible GPUs' and the host's free memory and a GPU's working memory
// for the run's checkpointing mode, and the placement the model then loads with.
#pragma once
#include <string>

#include "absl/status/statusor.h"
#include "models/config.h"
#include "train/device_plan.h"

namespace loom {

struct RunPlacement {
  DevicePlan plan;
  Placement placement;
  std::string description;  // the plan as the start of the run prints it
};

// `map`: auto, balanced, sequential or an accelerate device_map JSON file; `max_memory` as
// --max-memory takes it ("" for none: each device's free memory). `options.checkpointing` unset
// (nullopt): the fastest mode whose plan streams nothing (none, recompute, offload), else offload,
// which keeps the fewest bytes on a GPU per layer; the mode chosen goes back in `*mode`.
absl::StatusOr<RunPlacement> plan_run_placement(const ModelConfig& config, const std::string& map,
                                                const std::string& max_memory, PlanOptions options,
                                                std::optional<Checkpointing> requested, Checkpointing* mode);

// A GPU's working memory for a run of `options` besides what plan_units counts: the larger of the
// fused loss's workspace and one layer's activations while it runs or recomputes
// (train/checkpointing_plan.h's estimate, less the activations the units keep).
int64_t plan_working_bytes(const ModelConfig& config, const PlanOptions& options);

}  // namespace loom
