// The global gradient norm and torch.nn.utils.clip_grad_norm_'s clipping coefficient over many
// tensors in a few launches, left on the device so that the optimizer reads it there and the host
// never waits for it inside a training step:
//   norm = sqrt(sum over tensors of sum(g^2)),   coef = min(max_norm / (norm + 1e-6), 1)
// (a NaN coefficient stays NaN, as torch.clamp keeps it). The CPU side is composed of the
// per-tensor reductions in engine/ops (ops::grad_norm_coef).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/common.h"

namespace loom {
// torch.nn.utils.clip_grad_norm_'s factor for a global norm: min(max_norm / (norm + 1e-6), 1), a
// NaN kept as NaN (torch.clamp(max=1) keeps it), so that a poisoned step is not hidden.
LOOM_HD float clip_coefficient(float norm, float max_norm) {
  const float c = max_norm / (norm + 1e-6f);
  return c != c || c < 1.f ? c : 1.f;
}
}  // namespace loom

namespace loom::cuda {
// One gradient: `n` contiguous f32 or bf16 values.
struct GradSpan {
  const void* data = nullptr;
  int64_t n = 0;
  bool bf16 = false;
};
// Floats of scratch grad_norm_coef needs for `spans` gradients.
size_t grad_norm_workspace_floats(size_t spans);
// out[0] = norm, out[1] = coef (device f32). Deterministic: a fixed split of the values into
// chunks per launch (64 tensors a launch), block partials summed in order by one last block.
void grad_norm_coef(const std::vector<GradSpan>& spans, float max_norm, float* out, float* workspace, Stream s);
}  // namespace loom::cuda
