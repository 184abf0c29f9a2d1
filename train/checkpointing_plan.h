// `loom train --checkpointing auto` (the default): the fastest checkpointing mode whose memory fits
// on the device once the model is loaded — none, else recompute, else offload — from an estimate
// of what each mode keeps for one micro-batch.
#pragma once
#include <cstdint>
#include <string>

#include "engine/dtype.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "train/trainer.h"

namespace loom {

// One decoder layer's activations kept for backward, for `tokens` tokens: 7/4 I + 29/4 H values a
// token (a MoE layer: 29/4 H + k (7/4 I_expert + 9/4 H)), fitted to the peaks `loom train` measured on
// an H200 for the Llama 1B and 8B shapes (bench/results/session30/memory_check.md).
int64_t layer_activation_bytes(const ModelConfig& c, int64_t layer, int64_t tokens, DType act);
// The fused loss's chunk and workspace, which the peak of a step without checkpointing includes.
constexpr int64_t kLossWorkspaceBytes = int64_t{1} << 30;

// Bytes the rest of a step will allocate on the device, per mode, beside the weights, the trainable
// state and fixed_bytes: every layer's activations and the loss's workspace (none); every layer's
// input, and one layer's activations while it recomputes, or the loss's workspace, whichever is
// larger (recompute); the same without the inputs, with a few in flight (offload).
struct CheckpointingNeeds {
  int64_t none = 0;       // every layer's activations until backward
  int64_t recompute = 0;  // every layer's input, and one layer's activations while it recomputes
  int64_t offload = 0;    // one layer's activations and a few inputs in flight
};
// tokens: rows x sequence length of one micro-batch; act: the activation dtype; fixed_bytes: what
// every mode adds alike (gradients and optimizer state still to be allocated, the loss's chunk).
CheckpointingNeeds estimate_checkpointing_needs(const ModelConfig& c, int64_t tokens, DType act, int64_t fixed_bytes);

struct CheckpointingChoice {
  Checkpointing mode = Checkpointing::kNone;
  std::string reason;  // one line for the start of the run
};
// The first of none, recompute, offload whose need, with a margin (10 % + 512 MiB), fits in
// available_bytes; offload when none does (it may still run out: the error then says so).
CheckpointingChoice choose_checkpointing(const CheckpointingNeeds& needs, int64_t available_bytes,
                                         const std::string& device_name);

// What to try after the device ran out of memory while training with `cfg`, leanest change
// first, naming the flags and their values now: `mode` is the checkpointing in use (unset while
// the run was being set up), `step` the step that ran out (0: before the first). One sentence that
// begins with what was being done, for the end of the engine's out-of-memory message.
std::string out_of_memory_advice(const TrainConfig& cfg, std::optional<Checkpointing> mode, int64_t step);

}  // namespace loom
