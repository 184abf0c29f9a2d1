// `--device-map` / `--max-memory` for the commands that run a model without training it (forward,
// generate, chat): the plan for inference (no optimizer state, no activations kept), printed, and
// the placement the model loads with.
#pragma once
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "models/placement.h"
#include "tools/cli_args.h"

namespace loom::cli {

std::vector<FlagSpec> device_map_flags();
// Unset when --device-map is not given; the plan goes to stderr unless `quiet`.
absl::StatusOr<std::optional<Placement>> placement_from_flags(const Args& args, const std::string& model_path, DType dtype,
                                                              bool quiet);

}  // namespace loom::cli
