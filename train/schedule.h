// Learning-rate schedules with linear warmup (transformers' get_{constant,linear,cosine}_schedule_
// with_warmup) and global gradient-norm clipping (torch.nn.utils.clip_grad_norm_).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tensor.h"

namespace loom {

enum class LrScheduleKind { kConstant, kLinear, kCosine };
// "constant", "linear", "cosine" (transformers' lr_scheduler_type names); else InvalidArgument.
absl::StatusOr<LrScheduleKind> parse_lr_schedule(const std::string& name);
const char* lr_schedule_name(LrScheduleKind kind);

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kLinear;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // num_training_steps (optimizer updates)
  double num_cycles = 0.5;  // cosine only: 0.5 is one half-wave from 1 down to 0

  // The factor LambdaLR multiplies the base learning rate by after `step` scheduler steps (0-based).
  // The Trainer of transformers steps the scheduler after each optimizer update, so update k
  // (1-based, AdamWParams::step) uses base_lr * multiplier(k - 1): with warmup the first update has
  // lr 0, exactly as there.
  double multiplier(int64_t step) const;
  float lr(float base_lr, int64_t step) const { return static_cast<float>(base_lr * multiplier(step)); }
};

// The formulas, one per transformers function (warmup: step / max(1, warmup) while step < warmup):
//   constant: 1 after warmup
//   linear:   max(0, (total - step) / max(1, total - warmup))
//   cosine:   progress = (step - warmup) / max(1, total - warmup),
//             max(0, 0.5 * (1 + cos(pi * num_cycles * 2 * progress)))
double constant_with_warmup(int64_t step, int64_t warmup_steps);
double linear_with_warmup(int64_t step, int64_t warmup_steps, int64_t total_steps);
double cosine_with_warmup(int64_t step, int64_t warmup_steps, int64_t total_steps, double num_cycles = 0.5);

// TrainingArguments.get_warmup_steps: warmup_steps when > 0, else ceil(total_steps * warmup_ratio).
int64_t warmup_steps_for(int64_t warmup_steps, double warmup_ratio, int64_t total_steps);

struct GradNorm {
  float norm = 0.f;  // the global L2 norm of all gradients before clipping
  float coef = 1.f;  // min(1, max_norm / (norm + 1e-6)): pass as AdamWParams::grad_scale
};
// The global norm sqrt(sum over grads of sum(g^2)) and the clip coefficient of
// torch.nn.utils.clip_grad_norm_, in f32 like torch: each tensor is reduced on its device
// (ops::sum_squares), the partial sums are added on that device, and the host reads one scalar per
// device (torch takes the norm of per-tensor norms instead: the same value up to f32 rounding).
// Does not modify the gradients: the optimizer applies `coef` (AdamWParams::grad_scale), saving a
// pass over memory. Undefined tensors are skipped. As torch with error_if_nonfinite=False, a NaN
// norm gives a NaN coef and an infinite norm a coef of 0.
GradNorm clip_grad_norm(const std::vector<Tensor>& grads, float max_norm);
// The same, then multiplies every gradient by coef in place when coef < 1 (torch's behaviour).
GradNorm clip_grad_norm_(std::vector<Tensor>& grads, float max_norm);

}  // namespace loom
