// See run_placement.h.
#include "train/run_placement.h"

#include "absl/strings/str_cat.h"
#include "engine/memory.h"
#include "train/checkpointing_plan.h"

namespace loom {

int64_t plan_working_bytes(const ModelConfig& config, const PlanOptions& o) {
  int64_t kept = 0;
  for (const PlanUnit& u : plan_units(config, o)) kept += u.activation_bytes;
  const CheckpointingNeeds needs = estimate_checkpointing_needs(config, o.tokens, o.activation_dtype, 0);
  const int64_t need = o.checkpointing == Checkpointing::kNone        ? needs.none
                       : o.checkpointing == Checkpointing::kRecompute ? needs.recompute
                                                                      : needs.offload;
  return std::max<int64_t>(0, need - kept);
}

absl::StatusOr<RunPlacement> plan_run_placement(const ModelConfig& config, const std::string& map,
                                                const std::string& max_memory, PlanOptions options,
                                                std::optional<Checkpointing> requested, Checkpointing* mode) {
  MemoryCaps caps;
  if (!max_memory.empty()) {
    auto parsed = parse_max_memory(max_memory);
    if (!parsed.ok()) return parsed.status();
    caps = *parsed;
  }
  const int gpus = cuda_available() ? cuda_device_count() : 0;
  std::map<std::string, int64_t> available;
  for (int g = 0; g < gpus; ++g) available[Device::cuda(g).str()] = device_available_bytes(Device::cuda(g));
  available["cpu"] = device_available_bytes(Device::cpu());
  std::vector<Checkpointing> modes = {Checkpointing::kNone, Checkpointing::kRecompute, Checkpointing::kOffload};
  if (requested) modes = {*requested};
  if (gpus == 0 && !requested) modes = {Checkpointing::kNone};  // the CPU: nothing to stream or offload
  absl::StatusOr<DevicePlan> plan = absl::InternalError("no checkpointing mode tried");
  for (Checkpointing m : modes) {
    options.checkpointing = m;
    plan = plan_devices(plan_units(config, options), map, caps, gpus, available, plan_working_bytes(config, options));
    if (!plan.ok()) continue;
    if (plan->stream_slot_bytes == 0 || m == modes.back()) {
      *mode = m;
      break;
    }
  }
  if (!plan.ok()) return plan.status();
  RunPlacement r;
  r.plan = *std::move(plan);
  r.placement = r.plan.to_placement();
  r.description = r.plan.describe(caps);
  return r;
}

}  // namespace loom
