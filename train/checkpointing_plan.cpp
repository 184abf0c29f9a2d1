// See checkpointing_plan.h.
#include "train/checkpointing_plan.h"

#include "absl/strings/str_format.h"

namespace loom {
namespace {

std::string gib(int64_t bytes) { return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1LL << 30)); }

int64_t with_margin(int64_t bytes) { return bytes + bytes / 10 + (512LL << 20); }

}  // namespace

CheckpointingNeeds estimate_checkpointing_needs(const ModelConfig& c, int64_t tokens, DType act, int64_t fixed_bytes) {
  const int64_t bytes = bytes_for(act, 1);
  const int64_t layers = c.num_hidden_layers;
  // What a decoder layer keeps for backward, per token: the gate and up projections (down_proj's
  // input is computed again from them), the norms' outputs, q/k/v, the attention output, the
  // residual stream and the adapters' small products: 2 I + 9 H values, rounded up.
  const int64_t layer = tokens * (2 * c.intermediate_size + 9 * c.hidden_size) * bytes;
  const int64_t input = tokens * c.hidden_size * bytes;
  CheckpointingNeeds n;
  n.none = layers * layer + fixed_bytes;
  n.recompute = layers * input + 2 * layer + fixed_bytes;
  n.offload = 4 * input + 2 * layer + fixed_bytes;
  return n;
}

CheckpointingChoice choose_checkpointing(const CheckpointingNeeds& needs, int64_t available_bytes,
                                         const std::string& device_name) {
  const struct {
    Checkpointing mode;
    int64_t need;
  } order[] = {{Checkpointing::kNone, needs.none},
               {Checkpointing::kRecompute, needs.recompute},
               {Checkpointing::kOffload, needs.offload}};
  for (const auto& o : order) {
    if (with_margin(o.need) <= available_bytes) {
      std::string why = o.mode == Checkpointing::kNone
                            ? absl::StrFormat("keeping every activation needs about %s", gib(needs.none))
                            : absl::StrFormat("keeping every activation would need about %s, %s about %s",
                                              gib(needs.none), checkpointing_name(o.mode), gib(o.need));
      return {o.mode, absl::StrFormat("--checkpointing auto: %s (%s; %s available on %s)", checkpointing_name(o.mode),
                                      why, gib(available_bytes), device_name)};
    }
  }
  return {Checkpointing::kOffload,
          absl::StrFormat("--checkpointing auto: offload (even offload needs about %s and %s are available on %s: "
                          "a smaller --batch-size or --seq-len may be needed)",
                          gib(needs.offload), gib(available_bytes), device_name)};
}

}  // namespace loom
