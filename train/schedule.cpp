// Learning-rate schedules with warmup and global gradient-norm clipping; see schedule.h for the
// transformers and torch functions they reproduce.
#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "engine/ops.h"
#include "kernels/grad_norm.h"

namespace loom {

absl::StatusOr<LrScheduleKind> parse_lr_schedule(const std::string& name) {
  if (name == "constant") return LrScheduleKind::kConstant;
  if (name == "linear") return LrScheduleKind::kLinear;
  if (name == "cosine") return LrScheduleKind::kCosine;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown learning-rate schedule \"", name, "\": expected constant, linear or cosine"));
}

const char* lr_schedule_name(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kConstant: return "constant";
    case LrScheduleKind::kLinear: return "linear";
    case LrScheduleKind::kCosine: return "cosine";
  }
  return "?";
}

namespace {
// Python's float(a) / float(max(1, b)) on ints.
double ratio(int64_t a, int64_t b) { return static_cast<double>(a) / static_cast<double>(std::max<int64_t>(1, b)); }
}  // namespace

double constant_with_warmup(int64_t step, int64_t warmup_steps) {
  return step < warmup_steps ? ratio(step, warmup_steps) : 1.0;
}

double linear_with_warmup(int64_t step, int64_t warmup_steps, int64_t total_steps) {
  if (step < warmup_steps) return ratio(step, warmup_steps);
  return std::max(0.0, ratio(total_steps - step, total_steps - warmup_steps));
}

double cosine_with_warmup(int64_t step, int64_t warmup_steps, int64_t total_steps, double num_cycles) {
  if (step < warmup_steps) return ratio(step, warmup_steps);
  const double progress = ratio(step - warmup_steps, total_steps - warmup_steps);
  return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * num_cycles * 2.0 * progress)));
}

double LrSchedule::multiplier(int64_t step) const {
  switch (kind) {
    case LrScheduleKind::kConstant: return constant_with_warmup(step, warmup_steps);
    case LrScheduleKind::kLinear: return linear_with_warmup(step, warmup_steps, total_steps);
    case LrScheduleKind::kCosine: return cosine_with_warmup(step, warmup_steps, total_steps, num_cycles);
  }
  return 1.0;
}

int64_t warmup_steps_for(int64_t warmup_steps, double warmup_ratio, int64_t total_steps) {
  if (warmup_steps > 0) return warmup_steps;
  return static_cast<int64_t>(std::ceil(static_cast<double>(total_steps) * warmup_ratio));
}

GradNorm clip_grad_norm(const std::vector<Tensor>& grads, float max_norm) {
  const Tensor* first = nullptr;
  bool one_device = true;
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    if (!first) first = &g;
    one_device = one_device && g.device() == first->device();
  }
  GradNorm out;
  if (one_device) {
    const std::vector<double> v = ops::grad_norm_coef(grads, max_norm).to_doubles();
    out.norm = static_cast<float>(v[0]);
    out.coef = static_cast<float>(v[1]);
    return out;
  }
  // One running f32 scalar per device, so a step costs one host synchronization per device.
  std::vector<Tensor> totals;
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    Tensor s = ops::sum_squares(g);
    auto it = std::find_if(totals.begin(), totals.end(), [&](const Tensor& t) { return t.device() == g.device(); });
    if (it == totals.end())
      totals.push_back(s);
    else
      *it = ops::add(*it, s);
  }
  float sum = 0.f;
  for (const Tensor& t : totals) sum += t.item();
  out.norm = std::sqrt(sum);
  out.coef = clip_coefficient(out.norm, max_norm);
  return out;
}

GradNorm clip_grad_norm_(std::vector<Tensor>& grads, float max_norm) {
  const GradNorm n = clip_grad_norm(grads, max_norm);
  if (!(n.coef >= 1.f))  // multiplying by exactly 1 changes nothing; NaN propagates as in torch
    for (Tensor& g : grads)
      if (g.defined()) g.copy_(ops::scale(g, n.coef));
  return n;
}

}  // namespace loom
