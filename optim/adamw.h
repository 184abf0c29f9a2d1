// AdamW update rules: torch.optim.AdamW (f32 moments) and bitsandbytes' AdamW8bit (8-bit blockwise
// moments, f32 for tensors under 4096 elements), plus the factory behind `--optim`.
#pragma once
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/adamw.h"
#include "optim/optimizer.h"

namespace loom::optim {

struct AdamConfig {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
};

// The kernels' hyper-parameters for one update: the rule's betas and eps, the step's lr, decay,
// gradient scale and step count.
inline AdamWParams adamw_params(const AdamConfig& c, const StepArgs& a) {
  AdamWParams p;
  p.lr = a.lr;
  p.beta1 = c.beta1;
  p.beta2 = c.beta2;
  p.eps = c.eps;
  p.weight_decay = a.weight_decay;
  p.step = a.step;
  p.grad_scale = a.grad_scale;
  p.grad_scale_at = a.grad_scale_at;
  return p;
}

// torch.optim.AdamW (kernels/adamw.h): state "exp_avg", "exp_avg_sq" (f32).
std::unique_ptr<UpdateRule> make_adamw(const AdamConfig& config);

// bitsandbytes.optim.AdamW8bit (kernels/adamw8bit.h): state "state1", "state2" (u8 codes) and
// "absmax1", "absmax2" (f32 per block of 256) for ranges of at least 4096 elements, else
// "state1", "state2" in f32 with bitsandbytes' 32-bit rule; shared "qmap1" (signed dynamic map)
// and "qmap2" (unsigned), kept on `device`. Weight decay is applied after the update, as
// bitsandbytes does.
std::unique_ptr<UpdateRule> make_adamw8bit(const AdamConfig& config, Device device);

// "adamw" or "adamw8bit"; anything else is an InvalidArgument naming the choices.
absl::StatusOr<std::unique_ptr<UpdateRule>> make_update_rule(const std::string& name, const AdamConfig& config,
                                                              Device device);

}  // namespace loom::optim
