// NaN and infinity checks (see finite_check.h): kernels/finite.h on the host, a device sum first on CUDA.
#include "models/finite_check.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/ops.h"
#include "kernels/finite.h"

namespace loom {

int64_t first_nonfinite(const Tensor& t) {
  if (!t.defined() || !is_float(t.dtype()) || t.numel() == 0) return -1;
  if (t.is_cuda() && (t.dtype() == DType::f32 || t.dtype() == DType::bf16)) {
    // A finite sum means no NaN or infinity (it is a NaN or +-inf otherwise; finite weights summing
    // past 3.4e38 only cost the host scan below, never a wrong answer).
    if (std::isfinite(ops::sum(t.contiguous()).item())) return -1;
  }
  const Tensor h = t.is_cpu() ? t.contiguous() : t.to(Device::cpu()).contiguous();
  switch (h.dtype()) {
    case DType::f32: return cpu::first_nonfinite(h.data<float>(), h.numel());
    case DType::f64: return cpu::first_nonfinite(h.data<double>(), h.numel());
    case DType::bf16: return cpu::first_nonfinite(h.data<bf16>(), h.numel());
    case DType::f16: return cpu::first_nonfinite_f16(static_cast<const uint16_t*>(h.data_ptr()), h.numel());
    default: return -1;
  }
}

std::string describe_nonfinite(const Tensor& t, int64_t index) {
  const double v = t.reshape({-1}).narrow(0, index, 1).to_doubles()[0];
  std::vector<int64_t> at(t.shape().size());
  int64_t rest = index;
  for (size_t d = at.size(); d-- > 0;) {
    at[d] = rest % t.shape()[d];
    rest /= t.shape()[d];
  }
  return absl::StrCat(std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf", " at [", absl::StrJoin(at, ", "), "] (element ",
                      index, " of ", t.numel(), ")");
}

absl::Status check_finite(const Tensor& t, const std::string& where, const std::string& name, const std::string& advice) {
  const int64_t bad = first_nonfinite(t);
  if (bad < 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": tensor '", name, "' holds ", describe_nonfinite(t, bad), advice));
}

namespace {

// The tensors a save checks on their device (the rest on the host, as first_nonfinite does).
bool summed_on_device(const Tensor& t) {
  return t.defined() && t.is_cuda() && t.numel() > 0 && (t.dtype() == DType::f32 || t.dtype() == DType::bf16);
}

// True when every f32/bf16 CUDA tensor among `tensors` is known finite from one multi-tensor sum of
// squares per device and one copy to the host (the save at a run's end checks ~900 adapter and
// optimizer tensors: one sum and one host sync each made it tens of milliseconds). A NaN or infinity
// makes the sum non-finite; so can finite values past ~1.8e19, for which false only costs the
// tensor-by-tensor check below, never a wrong answer. Vacuously true without such tensors.
bool cuda_tensors_finite(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<std::pair<Device, std::vector<Tensor>>> groups;
  for (const auto& entry : tensors) {
    const Tensor& t = entry.second;  // (not a structured binding: clang 14 cannot capture one)
    if (!summed_on_device(t)) continue;
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == t.device(); });
    if (g == groups.end()) g = groups.insert(groups.end(), {t.device(), {}});
    g->second.push_back(t);
  }
  for (const auto& [device, group] : groups)
    if (!std::isfinite(ops::grad_norm_coef(group, INFINITY).to_doubles()[0])) return false;
  return true;
}

}  // namespace

absl::Status check_finite_to_save(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& path) {
  const bool cuda_finite = cuda_tensors_finite(tensors);
  for (const auto& [name, t] : tensors) {
    if (cuda_finite && summed_on_device(t)) continue;
    const int64_t bad = first_nonfinite(t);
    if (bad >= 0)
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to write ", path, ": tensor '", name, "' holds ", describe_nonfinite(t, bad),
          ": training diverged or the weights were damaged; nothing was written"));
  }
  return absl::OkStatus();
}

}  // namespace loom
