// Launcher environment detection (see launch_env.h).
#include "dist/launch_env.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace loom {
namespace {

struct Scheme {
  const char* name;
  const char* rank;
  const char* size;
  const char* local;  // may be null
};

// In order of preference: the most specific launcher first.
constexpr Scheme kSchemes[] = {
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"pmi", "PMIX_RANK", "PMIX_SIZE", nullptr},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
};

absl::StatusOr<int> read_int(const std::function<const char*(const char*)>& env, const char* key, int lo) {
  const char* v = env(key);
  int out = 0;
  if (!v || !absl::SimpleAtoi(v, &out) || out < lo)
    return absl::InvalidArgumentError(absl::StrCat("launcher variable ", key, "='", v ? v : "", "' is not an integer >= ", lo));
  return out;
}

}  // namespace

absl::StatusOr<LaunchEnv> detect_launch_env(const std::function<const char*(const char*)>& env) {
  for (const Scheme& s : kSchemes) {
    if (!env(s.rank)) continue;
    LaunchEnv e;
    e.launcher = s.name;
    auto rank = read_int(env, s.rank, 0);
    if (!rank.ok()) return rank.status();
    // PMIx exports no size variable everywhere; Slurm's then tells it.
    const char* size_key = env(s.size) ? s.size : (env("SLURM_NTASKS") ? "SLURM_NTASKS" : s.size);
    auto size = read_int(env, size_key, 1);
    if (!size.ok()) return size.status();
    if (*rank >= *size)
      return absl::InvalidArgumentError(absl::StrCat("launcher says rank ", *rank, " (", s.rank, ") of ", *size, " (",
                                                     size_key, ")"));
    e.rank = *rank;
    e.world_size = *size;
    const char* local_key = s.local && env(s.local) ? s.local : (env("SLURM_LOCALID") ? "SLURM_LOCALID" : nullptr);
    if (local_key) {
      auto local = read_int(env, local_key, 0);
      if (!local.ok()) return local.status();
      e.local_rank = *local;
    } else {
      e.local_rank = e.rank;  // one host assumed when the launcher does not say
    }
    return e;
  }
  return LaunchEnv{0, 1, 0, "single"};
}

}  // namespace loom
