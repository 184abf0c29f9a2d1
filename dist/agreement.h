// Start-of-run agreement: every rank hashes the fields that must match (model, LoRA/full config,
// data file, seed, dtype, ...) and the ranks compare the hashes, so that a rank started with a
// different model or data file is refused on every rank, with the differing field named, instead
// of silently training different things.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "dist/communicator.h"

namespace loom::dist {

// FNV-1a 64 of a string (stable across platforms and builds).
uint64_t fnv1a64(const std::string& s);

// Collective over `comm`. fields: (name, value) in the same order on every rank. OK when every
// rank has the same values; otherwise the same FailedPrecondition on every rank naming the first
// differing field, the ranks that differ from rank 0, and rank 0's and (up to seven of) their values,
// so that whichever rank prints first says it all.
absl::Status check_agreement(Communicator& comm, const std::vector<std::pair<std::string, std::string>>& fields);

}  // namespace loom::dist
