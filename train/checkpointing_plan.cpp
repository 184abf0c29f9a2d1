// See checkpointing_plan.h.
#include "train/checkpointing_plan.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace loom {
namespace {

std::string gib(int64_t bytes) { return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1LL << 30)); }

int64_t with_margin(int64_t bytes) { return bytes + bytes / 10 + (512LL << 20); }

}  // namespace

int64_t layer_activation_bytes(const ModelConfig& c, int64_t layer, int64_t tokens, DType act) {
  // Quarter values a token: the attention's part (norms, q/k/v, attention output, residual) and the
  // MLP's (gate and up; down_proj's input is computed again from them), or k expert rows' of each
  // (gate and up, two tensors; the rest is made again in backward from them or from the token's
  // input, kept once a token) and a hidden-wide row's worth of transients.
  int64_t quarters = 29 * c.hidden_size;
  if (c.is_moe_layer(layer))
    quarters += c.moe.experts_per_token * (8 * c.moe.expert_intermediate + 4 * c.hidden_size) + 4 * c.hidden_size;
  else
    quarters += 7 * c.intermediate_size;
  return tokens * quarters / 4 * bytes_for(act, 1);
}

CheckpointingNeeds estimate_checkpointing_needs(const ModelConfig& c, int64_t tokens, DType act, int64_t fixed_bytes) {
  const int64_t input = tokens * c.hidden_size * bytes_for(act, 1);
  int64_t all = 0, largest = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const int64_t layer = layer_activation_bytes(c, i, tokens, act);
    all += layer;
    largest = std::max(largest, layer);
  }
  constexpr int64_t kSlack = int64_t{256} << 20;  // a layer's transient gradients beside its activations
  CheckpointingNeeds n;
  n.none = all + kLossWorkspaceBytes + fixed_bytes;
  n.recompute = c.num_hidden_layers * input + std::max(kLossWorkspaceBytes, largest + kSlack) + fixed_bytes;
  // Offload's attention stash (autograd/stash.h): the layer before's attention output and
  // log-sum-exp come back with its input, one layer ahead of need.
  const int64_t stashed = tokens * (c.q_dim() * bytes_for(act, 1) + c.num_attention_heads * 4);
  n.offload = std::max(kLossWorkspaceBytes, largest + 4 * input + stashed + kSlack) + fixed_bytes;
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

std::string out_of_memory_advice(const TrainConfig& cfg, std::optional<Checkpointing> mode, int64_t step) {
  std::vector<std::string> tries;
  if (mode == Checkpointing::kNone)
    tries.push_back("--checkpointing recompute (each decoder layer keeps only its input and recomputes the rest in "
                    "backward, a quarter to a third more time) or --checkpointing offload (those inputs in pinned host memory)");
  if (mode == Checkpointing::kRecompute)
    tries.push_back("--checkpointing offload (the layer inputs go to pinned host memory, a few per cent more time)");
  if (mode && cfg.batch_size > 1)
    tries.push_back(absl::StrFormat("a smaller --batch-size (now %d) with a larger --grad-accum (now %d) for the same "
                                    "global batch",
                                    cfg.batch_size, cfg.grad_accum));
  if (mode) tries.push_back(absl::StrFormat("a shorter --seq-len (now %d)", cfg.seq_len));
  if (!cfg.full && !cfg.qlora) tries.push_back("--qlora (4-bit base weights: about 0.28x the bf16 bytes)");
  if (cfg.resolved_dtype() == DType::f32) tries.push_back("--dtype bf16");
  if (cfg.full && cfg.optim == "adamw") tries.push_back("--optim adamw8bit (optimizer state in 8 bits)");
  if (cfg.full && !cfg.offload_optimizer)
    tries.push_back("--offload-optimizer (f32 masters and optimizer state in host memory)");
  const std::string doing =
      !mode ? std::string("Setting up the run (the model, LoRA, the optimizer)")
            : absl::StrFormat("Training step %d (%d x %d tokens a micro-batch, --checkpointing %s)", step, cfg.batch_size,
                              cfg.seq_len, checkpointing_name(*mode));
  if (tries.empty()) return doing + ": nothing leaner is left to try on this device.";
  return absl::StrCat(doing, ": try ", absl::StrJoin(tries, "; "), ".");
}

}  // namespace loom
